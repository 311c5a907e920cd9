"""``kiln`` command line: run the pipeline on a photo, serve the web UI, check the machine.

Heavy libraries are imported inside the commands so ``kiln --help`` stays instant.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import textwrap
import time
from pathlib import Path

from . import settings as settings_mod

EXIT_CODES = ("Exit status: 0 the GLB was written; 1 the job failed (a stage error, a worker crash "
              "or hang, no worker could start); 2 a usage or input problem (bad flag, setting, "
              "image or mask, or a stage rejected the input); 130 interrupted by Ctrl-C (the "
              "running job is cancelled and its worker stopped).")


class CliError(Exception):
    """A problem the user can fix; printed without a traceback."""

    exit_code = 2


class JobFailed(CliError):
    """The job ran and failed (or no worker could run it)."""

    exit_code = 1


class Cancelled(CliError):
    """Ctrl-C: the job was cancelled."""

    exit_code = 130


def _settings_from_args(args) -> settings_mod.Settings:
    overrides: dict = {}
    for item in args.set or []:
        if "=" not in item:
            raise CliError(f"--set expects KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        overrides[k.strip()] = v.strip()
    flag_map = {
        "bake.enabled": args.bake,
        "mesh.simplify_ratio": args.simplify_ratio,
        "bake.texture_size": args.texture_size,
        "views.count": args.views,
        "bake.mode": args.bake_mode,
        "seed": args.seed,
        "export.gaussians_ply": True if args.ply else None,
        "worker.device": args.device,
    }
    overrides.update({k: v for k, v in flag_map.items() if v is not None})
    return settings_mod.load(args.config, overrides)


def load_inputs(image_path: str, mask_path: str | None, max_pixels: int):
    """(rgb (H,W,3) uint8, mask (H,W) bool) from an image and an optional mask file.

    Without a mask file the image's alpha channel is the mask; an opaque image
    without a mask is refused with a message saying what to pass.
    """
    import numpy as np

    from .imageio import ImageError, load_image

    try:
        rgb, alpha = load_image(image_path, max_pixels=max_pixels)
    except ImageError as e:
        raise CliError(f"image {image_path}: {e}") from None
    if mask_path:
        try:
            m_rgb, m_alpha = load_image(mask_path, max_pixels=max_pixels)
        except ImageError as e:
            raise CliError(f"mask {mask_path}: {e}") from None
        if m_rgb.shape[:2] != rgb.shape[:2]:
            raise CliError(f"mask {mask_path} is {m_rgb.shape[1]}x{m_rgb.shape[0]} but the image is "
                           f"{rgb.shape[1]}x{rgb.shape[0]}; they must match")
        grey = m_rgb.mean(axis=2)
        if m_alpha is not None and (m_alpha < 255).any() and grey.min() == grey.max():
            mask = m_alpha > 127
        else:
            mask = grey > 127
    else:
        if alpha is None or (alpha == 255).all():
            raise CliError(f"no mask: {image_path} has no transparency, so the object cannot be told "
                           "from the background; pass --mask MASK.png (white = object) or use a "
                           "transparent PNG")
        mask = alpha > 127
    return rgb, np.ascontiguousarray(mask)


class Progress:
    """Per-stage progress. On a terminal each stage gets one line whose bar is redrawn
    in place from empty to full; piped, a line when a stage starts and one when it ends."""

    WIDTH = 24

    def __init__(self, stream=None):
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty()
        self.stage = None      # the stage being shown
        self.ended = False     # that stage was shown complete
        self.open = False      # a terminal line still waits for its newline
        self.t0 = time.perf_counter()

    def update(self, stage: str, fraction: float, message: str = "") -> None:
        """``fraction``: 0..1 within ``stage`` (not over the whole job)."""
        fraction = max(0.0, min(1.0, fraction))
        new = stage != self.stage
        if new:
            self._end_line()
            self.stage, self.ended = stage, False
        if self.ended:
            return  # a stage may report 1.0 more than once; its line is finished
        self.ended = fraction >= 1.0
        elapsed = time.perf_counter() - self.t0
        if self.tty:
            filled = int(round(fraction * self.WIDTH))
            bar = "#" * filled + "-" * (self.WIDTH - filled)
            self.stream.write(f"\r\033[K{elapsed:6.1f}s  {stage:<13} [{bar}] {message[:40]}")
            self.open = not self.ended
            if self.ended:
                self.stream.write("\n")
        elif new or self.ended:
            self.stream.write(f"{elapsed:6.1f}s  {stage:<13} {message}\n")
        self.stream.flush()

    def note(self, text: str) -> None:
        """A line of its own (e.g. a retry); the next update starts a new stage line."""
        self._end_line()
        self.stage = None
        self.stream.write(f"{time.perf_counter() - self.t0:6.1f}s  {text}\n")
        self.stream.flush()

    def _end_line(self) -> None:
        if self.open:
            self.stream.write("\n")
            self.open = False


def timing_table(timings: dict, total: float, extra: dict | None = None) -> str:
    """Stage times in pipeline order, then ``extra`` rows (worker start, queue), then
    whatever else the run took, so the rows add up to ``total``."""
    rows = [(k, v) for k, v in timings.items() if not k.endswith("_s")]  # *_s: job-level
    rows += [(k, v) for k, v in (extra or {}).items() if v]
    other = total - sum(t for _, t in rows)
    if other >= 0.005:
        rows.append(("other", other))
    lines = [f"{'stage':<14}{'seconds':>9}", "-" * 23]
    lines += [f"{s:<14}{t:>9.2f}" for s, t in rows]
    lines += ["-" * 23, f"{'total':<14}{total:>9.2f}"]
    return "\n".join(lines)


def cmd_run(args) -> int:
    settings = _settings_from_args(args)
    rgb, mask = load_inputs(args.image, args.mask, settings.app.max_pixels)
    out = Path(args.output or Path(args.image).with_suffix(".glb").name)
    if out.suffix.lower() != ".glb":
        raise CliError(f"output {out} must end in .glb")
    out.parent.mkdir(parents=True, exist_ok=True)
    progress = Progress()
    t0 = time.perf_counter()
    if args.in_process:
        result = _run_in_process(rgb, mask, settings, out, progress)
    else:
        result = _run_in_worker(rgb, mask, settings, out, progress)
    total = time.perf_counter() - t0
    print(timing_table(result["timings"], total, result.get("extra")), file=sys.stderr)
    for k in ("faces", "vertices", "bake_psnr_db", "reconstruction_cached"):
        if k in result.get("stats", {}):
            print(f"{k}: {result['stats'][k]}", file=sys.stderr)
    if args.report:
        import json

        Path(args.report).write_text(json.dumps(
            {"timings": result["timings"], "total_s": total, "stats": result.get("stats", {}),
             "glb": str(out.resolve())}, indent=2, default=str))
    print(f"wrote {out.resolve()}")
    if result.get("ply"):
        print(f"wrote {Path(result['ply']).resolve()}")
    return 0


def _run_in_process(rgb, mask, settings, out: Path, progress: Progress) -> dict:
    from pipeline.run import run_pipeline
    from pipeline.types import ImageInput

    cache = Path(settings.app.cache_dir)
    res = run_pipeline(ImageInput(rgb, mask), settings, out.parent, on_event=progress.update,
                       cache_dir=cache, name=out.stem)
    if res.glb_path != out:
        shutil.move(res.glb_path, out)
    return {"timings": res.timings, "stats": res.stats, "ply": res.ply_path}


def _copy_atomic(src, dst: Path) -> None:
    """Copy a job's output so an interrupted copy never leaves a torn file at ``dst``."""
    from .atomic import atomic_write

    with open(src, "rb") as f:
        atomic_write(dst, lambda out: shutil.copyfileobj(f, out))


def _run_in_worker(rgb, mask, settings, out: Path, progress: Progress) -> dict:
    from worker.supervisor import Supervisor, WorkerStartError

    t0 = time.perf_counter()
    sup = Supervisor(settings, jobs_dir=Path(settings.app.jobs_dir),
                     cache_dir=Path(settings.app.cache_dir))
    try:
        sup.start()   # on failure (or Ctrl-C) it has already stopped what it started
    except WorkerStartError as e:
        raise JobFailed(f"the worker could not start: {e}") from None
    startup = time.perf_counter() - t0
    try:
        job_id = sup.submit(rgb, mask, settings, session="cli")
        try:
            _show_events(sup.follow(job_id), progress)
        except KeyboardInterrupt:
            progress.note("interrupted: cancelling the job")
            if sup.cancel(job_id):
                raise Cancelled(f"cancelled job {job_id}; the worker running it was stopped") from None
            raise Cancelled(f"interrupted; job {job_id} had already ended "
                            f"({sup.status(job_id).state})") from None
        st = sup.status(job_id)
    finally:
        sup.shutdown()
    if st.state != "done":
        error = st.error or st.message
        # a stage refusing the input is the user's to fix, as in --in-process
        kind = CliError if "StageInputError:" in error else JobFailed
        raise kind(f"job {job_id} {st.state}: {error} (log: {sup.job_dir(job_id) / 'log'})")
    _copy_atomic(st.outputs["glb"], out)
    ply = None
    if st.outputs.get("ply"):
        ply = out.with_suffix(".ply")
        _copy_atomic(st.outputs["ply"], ply)
    extra = {"worker start": startup, "queued": st.timings.get("queued_s", 0.0)}
    return {"timings": st.timings, "stats": st.stats, "ply": ply, "extra": extra}


def _show_events(events, progress: Progress) -> None:
    """Feed each stage's own progress to the bar; say it when an attempt is retried."""
    was = None
    for ev in events:
        if ev.state == "queued" and was == "running":
            progress.note(ev.message)   # why the attempt failed and how it is retried
        elif ev.state == "running" and ev.stage:
            message = ev.message.removeprefix(f"{ev.stage}: ")
            progress.update(ev.stage, ev.stage_progress, message)
        was = ev.state


def cmd_serve(args) -> int:
    from app.server import main as serve_main

    return serve_main(args.rest)


def cmd_doctor(args) -> int:
    from .doctor import main as doctor_main

    return doctor_main(args.rest)


def cmd_settings(args) -> int:
    for key, default, allowed in settings_mod.describe():
        print(f"{key:<32} {str(default):<14} {allowed}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kiln",
        description="Kiln: one photo -> textured 3D model (GLB).",
        epilog="Examples:\n  kiln run photo.png -o photo.glb            (transparent PNG: alpha is the mask)\n"
               "  kiln run photo.jpg --mask mask.png --no-bake --simplify-ratio 0.98\n"
               "  kiln serve                                  (web UI on http://127.0.0.1:7860)\n"
               "  kiln doctor                                 (check CUDA, compilers, backends)\n\n"
               + textwrap.fill(EXIT_CODES.replace("Exit status:", "Exit status of `kiln run`:"), 88),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    r = sub.add_parser("run", help="turn an image (+ mask) into a GLB",
                       description="Run the whole pipeline on one image and write a GLB. The stages run "
                                   "in a crash-isolated worker process (--in-process: in this one). "
                                   "Settings come from configs/default.yaml (or --config); flags "
                                   "override them.",
                       epilog=EXIT_CODES)
    r.add_argument("image", help="input photo (PNG/JPEG/...); a transparent PNG's alpha is the mask")
    r.add_argument("--mask", help="mask image, white = object (required unless the image has transparency)")
    r.add_argument("-o", "--output", help="output .glb path (default: IMAGE name with .glb, here)")
    r.add_argument("--config", help="settings YAML (default: configs/default.yaml)")
    bake = r.add_mutually_exclusive_group()
    bake.add_argument("--bake", dest="bake", action="store_true", default=None, help="bake a texture (default)")
    bake.add_argument("--no-bake", dest="bake", action="store_false", help="export vertex colours instead of a texture")
    r.add_argument("--simplify-ratio", type=float, help="fraction of faces removed, 0-0.999 (default 0.95)")
    r.add_argument("--texture-size", type=int, help="texture size in texels, power of two 256-4096 (default 1024)")
    r.add_argument("--views", type=int, help="number of bake views, 1-64 (default 16)")
    r.add_argument("--bake-mode", choices=["fast", "opt"], help="texture bake mode (default opt)")
    r.add_argument("--seed", type=int, help="random seed (default 0)")
    r.add_argument("--ply", action="store_true", help="also write the Gaussians as a 3DGS .ply next to the GLB")
    r.add_argument("--device", choices=["auto", "cpu", "cuda"], help="worker device (default auto)")
    r.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override any setting, e.g. --set bake.steps=200 (see `kiln settings`)")
    r.add_argument("--report", metavar="JSON", help="write stage timings and stats to this JSON file")
    r.add_argument("--in-process", action="store_true",
                   help="run the stages in this process instead of a crash-isolated worker (debugging)")
    r.set_defaults(func=cmd_run)

    s = sub.add_parser("serve", help="start the web UI (see `kiln serve --help`)", add_help=False)
    s.add_argument("rest", nargs=argparse.REMAINDER)
    s.set_defaults(func=cmd_serve)

    d = sub.add_parser("doctor", help="check Python, torch/CUDA, compilers, backends, checkpoints", add_help=False)
    d.add_argument("rest", nargs=argparse.REMAINDER)
    d.set_defaults(func=cmd_doctor)

    st = sub.add_parser("settings", help="list every setting with its default and allowed values")
    st.set_defaults(func=cmd_settings)
    # listed for --help only: main() hands `kiln selftest ...` to worker.selftest, which owns its flags
    sub.add_parser("selftest", help="check each GPU backend against its CPU twin, a job in a worker, "
                                    "recovery from a sticky CUDA error", add_help=False)
    return p


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["selftest"]:
        from worker.selftest import main as selftest_main

        return selftest_main(argv[1:])
    # serve and doctor own their flags; argparse's REMAINDER would reject a leading "-x"
    if argv and argv[0] in ("serve", "doctor"):
        args = argparse.Namespace(func=cmd_serve if argv[0] == "serve" else cmd_doctor, rest=argv[1:])
        return args.func(args)
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except Cancelled as e:
        print(f"kiln: {e}", file=sys.stderr)
        return e.exit_code
    except CliError as e:
        print(f"kiln: error: {e}", file=sys.stderr)
        return e.exit_code
    except settings_mod.SettingsError as e:
        print(f"kiln: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kiln: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # stage validation errors etc.: say what, not a traceback
        from_pipeline = type(e).__name__ in ("StageInputError", "ImageError")
        if not from_pipeline:
            raise
        print(f"kiln: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
