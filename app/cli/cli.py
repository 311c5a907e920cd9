"""``kiln`` command line: run the pipeline on a photo, serve the web UI, check the machine.

Heavy libraries are imported inside the commands so ``kiln --help`` stays instant.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
import time
from pathlib import Path

from kiln import settings as settings_mod
from kiln.formats import human_bytes
from kiln.limits import MIN_EXACT_FACES
from worker.child.env import passive_openmp
from worker.jobs.inputs import InputProblem, Loaded, NoSpace, is_no_space, no_space

from app.cli.cliargs import add_format_flags, settings_from_args
from app.cli.clibake import add_parser as add_bake_parser
from app.cli.climodels import add_parser as add_models_parser
from app.cli.clijobs import add_parser as add_jobs_parser
from app.cli.clirunner import Cancelled, CliError, InProcessRunner, CliJobFailed, WorkerRunner, write_report
from app.cli.cliview import BatchLine, ItemResult, ProgressLine, summary_table, timing_table, written_files

EXIT_CODES = ("Exit status: 0 the GLB was written (every GLB, with several images); 1 the job "
              "failed (a stage error, a worker crash or hang, no worker could start, no space "
              "left on a disk) or, with several images, any of them failed; 2 a usage or input "
              "problem (bad flag, setting, image or mask, or a stage rejected the input), found "
              "before any job is made (the worker that starts beside the checks is stopped); 130 interrupted by Ctrl-C (the running job is cancelled "
              "and its worker stopped).")

__all__ = ["main", "build_parser", "CliError", "CliJobFailed", "Cancelled", "ProgressLine", "timing_table"]


def _validate(items, settings, mask_dir, keep: bool, find_mask=None) -> list[Loaded]:
    """Read every input completely before anything starts; refuse them all at once if any
    is unusable. Returns the loaded inputs (arrays dropped unless ``keep``: a batch
    reads each image again when its turn comes, so memory holds one image at a time).
    ``find_mask``: --mask auto's finder (``app.cli.cliautomask.AutoMasker``)."""
    import numpy as np

    from worker.jobs.inputs import load

    loaded: list[Loaded] = []
    problems: list[str] = []
    for item in items:
        try:
            got = load(item, settings.app.max_pixels, settings.reconstruct, mask_dir, find_mask)
        except InputProblem as e:
            problems.append(str(e))
            continue
        if not keep:   # only the notes stay
            got = Loaded(rgb=np.empty((0, 0, 3), np.uint8), mask=np.empty((0, 0), bool), notes=got.notes,
                         found=got.found)
        loaded.append(got)
    if problems and len(items) == 1:
        raise CliError(problems[0])
    if problems:
        raise CliError(f"{len(problems)} of {len(items)} inputs cannot be used, so nothing was "
                       "started:\n  " + "\n  ".join(problems))
    return loaded


def _space_check(items, settings) -> None:
    from PIL import Image

    from worker.jobs.inputs import check_space, job_bytes

    pixels = 0
    for item in items:
        with Image.open(item.image) as im:   # header only; the image was read once already
            pixels = max(pixels, im.width * im.height)
    places = [Path(settings.app.jobs_dir), Path(settings.app.cache_dir)]
    places += sorted({item.output.parent for item in items})
    check_space(places, job_bytes(pixels, settings.bake.texture_size))


def cmd_run(args) -> int:
    from worker.jobs.inputs import load, plan

    settings = settings_from_args(args)
    try:
        items, batch = plan(args.image, args.mask, args.mask_dir, args.output)
    except InputProblem as e:
        raise CliError(str(e)) from None
    if args.resume and args.in_process:
        raise CliError("--resume reads the job store of crash-isolated workers; it cannot be used with --in-process")
    runner = InProcessRunner(settings) if args.in_process else WorkerRunner(settings, resume=args.resume)
    if isinstance(runner, WorkerRunner):
        # the worker starts (~2 s: interpreter, torch, probes) while the inputs are read and
        # checked below; a refusal stops it again before any job is made
        runner.start_early()
    try:
        loaded, find_mask = _check_inputs(items, batch, settings, args)
    except BaseException:
        runner.close()
        raise
    if not batch:
        return _run_one(runner, items[0], loaded[0], args)
    return _run_batch(runner, items, lambda item: load(item, settings.app.max_pixels, settings.reconstruct,
                                                     args.mask_dir, find_mask), args)


def _check_inputs(items, batch: bool, settings, args):
    """Read and check every input, say what the person should know of each, check the free
    space and make the output folders; raises CliError (or NoSpace) to refuse them all.
    Returns (the loaded inputs, --mask auto's finder or None)."""
    from worker.jobs.inputs import AUTO, writing_to

    find_mask = None
    if args.mask == AUTO:
        from app.cli.cliautomask import AutoMasker

        find_mask = AutoMasker(settings.app, batch)
    loaded = _validate(items, settings, args.mask_dir, keep=not batch, find_mask=find_mask)
    for item, got in zip(items, loaded):
        for note in got.notes:
            if not batch or got.found:
                print(note, file=sys.stderr)
            elif "thresholded" in note:   # a batch says only what the person may not expect
                print(f"{item.image.name}: {note}", file=sys.stderr)
    _space_check(items, settings)
    for out_dir in sorted({item.output.parent for item in items}):
        with writing_to(out_dir):
            out_dir.mkdir(parents=True, exist_ok=True)
    return loaded, find_mask


def _run_one(runner, item, got, args) -> int:
    """One image: per-stage bars, then the timing table and stats."""
    progress = ProgressLine()
    # from the worker's early start when there was one: its start is in the table, and the
    # checks it overlapped are then in "other"
    t0 = runner.t0 or time.perf_counter()
    try:
        startup = runner.start()
        result = runner.run(got, item.output, progress)
    finally:
        runner.close()
    total = time.perf_counter() - t0
    extra = {"worker start": startup, "queued": result["queued"]}
    print(timing_table(result["timings"], total, extra), file=sys.stderr)
    stats = result["stats"]
    for k, v in _stats_lines(stats.pipeline):
        print(f"{k}: {v}", file=sys.stderr)
    for w in stats.pipeline.warnings if stats.pipeline is not None else ():
        print(f"kiln: warning: {w}", file=sys.stderr)
    out = item.output
    written = written_files(out, result, stats.pipeline)
    if args.report:
        write_report(args.report, {"timings": result["timings"], "total_s": total,
                                    "stats": stats.to_dict(), "glb": str(out.resolve()), "files": written,
                                    "mask_notes": list(got.notes)})
    source = f", {result['source']}" if result.get("source") else ""
    for i, f in enumerate(written):
        print(f"wrote {f['path']} ({human_bytes(f['bytes'])}{source if i == 0 else ''})")
    return 0


def _stats_lines(p) -> list[tuple[str, object]]:
    """The stats a person running one image sees, under their report names; ``p``: the
    job's ``kiln.records.PipelineStats`` (None: nothing to say)."""
    if p is None:
        return []
    bake = p.bake
    rows = [("faces", p.faces), ("vertices", p.vertices),
            ("bake_psnr_db", bake.psnr_db if bake else None),
            ("reconstruction_cached", p.reconstruction_cached), ("views_cached", p.views_cached),
            ("texture_size_auto", p.texture_size_auto),
            ("photo_pixels_per_texel", bake.photo_pixels_per_texel if bake else None)]
    return [(k, v) for k, v in rows if v is not None]


def _run_batch(runner, items, load_item, args) -> int:
    """Several images through one worker: a line each, a summary table, 1 if any failed."""
    results = [ItemResult(image=item.image, output=item.output) for item in items]
    t0 = runner.t0 or time.perf_counter()   # from the worker's early start, as in _run_one
    interrupted = None
    try:
        runner.start()
        for i, (item, r) in enumerate(zip(items, results), 1):
            line = BatchLine(i, len(items), item.image.name)
            t1 = time.perf_counter()
            try:
                got = load_item(item)
                res = runner.run(got, item.output, line)
                r.state, r.timings, r.stats, r.ply = "done", res["timings"], res["stats"], res["ply"]
                r.source = res.get("source", "")
                r.files = written_files(item.output, res, res["stats"].pipeline)
            except Cancelled as e:
                r.state, r.error, interrupted = "cancelled", str(e), e
            except KeyboardInterrupt:   # --in-process, or between jobs
                r.state, r.error = "cancelled", "interrupted"
                interrupted = Cancelled("interrupted")
            except (CliError, InputProblem, NoSpace) as e:
                r.state, r.error = "failed", str(e)
            except Exception as e:  # noqa: BLE001 - --in-process: a stage's error fails its image only
                r.state, r.error = "failed", f"{type(e).__name__}: {e}"
            r.seconds = time.perf_counter() - t1
            line.finish(r)
            if interrupted:
                break
    finally:
        runner.close()
    total = time.perf_counter() - t0
    print(summary_table(results, total, runner.startup))
    if args.report:
        write_report(args.report, {"images": [r.to_dict() for r in results], "total_s": total,
                                    "worker_start_s": runner.startup})
    if interrupted:
        raise interrupted
    return 1 if any(r.state != "done" for r in results) else 0


def cmd_serve(args) -> int:
    from app.web.server.launch import main as serve_main

    return serve_main(args.rest)


def cmd_doctor(args) -> int:
    from worker.checks.doctor import main as doctor_main

    return doctor_main(args.rest)


def cmd_settings(args) -> int:
    for key, default, allowed in settings_mod.describe():
        print(f"{key:<32} {str(default):<14} {allowed}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kiln",
        description="Kiln: one photo -> textured 3D model (GLB); or a texture for a model you have.",
        epilog="Examples:\n  kiln run photo.png -o photo.glb            (transparent PNG: alpha is the mask)\n"
               "  kiln run photo.jpg --mask mask.png --no-bake --simplify-ratio 0.98\n"
               "  kiln run a.png b.jpg --mask-dir masks/ -o out/   (several images, one worker)\n"
               "  kiln run shot.jpg --mask auto               (find the object on a plain background)\n"
               "  kiln run photo.png --format glb,obj,stl --units mm --texture-format jpeg\n"
               "  kiln bake --mesh m.glb --splat s.ply -o baked.glb (texture a mesh you already have)\n"
               "  kiln serve                                  (web UI on http://127.0.0.1:7860)\n"
               "  kiln doctor                                 (check CUDA, compilers, backends)\n"
               "  kiln models fetch tiny                      (download the SAM 2.1 tiny checkpoint)\n\n"
               + textwrap.fill(EXIT_CODES.replace("Exit status:", "Exit status of `kiln run`:"), 88),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    r = sub.add_parser("run", help="turn an image (+ mask) into a GLB; several images in one go",
                       description="Run the whole pipeline on an image and write a GLB (and, with "
                                   "--format, OBJ, STL or PLY files beside it). The stages run "
                                   "in a crash-isolated worker process (--in-process: in this one). "
                                   "Every image and mask is checked before the worker starts. With "
                                   "several images (or --mask-dir) one worker takes them in turn: a "
                                   "line each, then a summary table. Settings come from "
                                   "configs/default.yaml (or --config); flags override them.",
                       epilog=EXIT_CODES)
    r.add_argument("image", nargs="+", metavar="IMAGE",
                   help="input photo(s) (PNG/JPEG/WebP/TIFF/BMP/GIF); a transparent image's alpha is "
                        "its mask. Several images run one after another through one worker")
    r.add_argument("--mask", help="mask file of the one IMAGE: white = object; an RGBA file whose "
                                  "alpha varies is read by its alpha; more than two grey levels are "
                                  "thresholded halfway (required unless the image has transparency). "
                                  "'auto': find the object of each image that has no transparency "
                                  "(or, with --mask-dir, no mask file) automatically: SAM 2 when its "
                                  "checkpoint is installed, else a model of a plain or smooth "
                                  "background taken from the image border; an image in which no "
                                  "single object stands out is refused (exit 2) with the reason")
    r.add_argument("--mask-dir", metavar="FOLDER",
                   help="folder with a mask per image, named like the image (a.png, a_mask.png, "
                        "a-mask.png, any image type); an image without one uses its transparency "
                        "(or, with --mask auto, the object found automatically)")
    r.add_argument("-o", "--output", help="one image: output .glb path or a folder (default: IMAGE "
                                          "name with .glb, here); several images or --mask-dir: "
                                          "the folder for <image name>.glb (default: here). "
                                          "--format's other files go beside each GLB, named after it "
                                          "(photo.obj.zip, photo.stl, photo.mesh.ply)")
    r.add_argument("--config", help="settings YAML (default: configs/default.yaml)")
    bake = r.add_mutually_exclusive_group()
    bake.add_argument("--bake", dest="bake", action="store_true", default=None, help="bake a texture (default)")
    bake.add_argument("--no-bake", dest="bake", action="store_false", help="export vertex colours instead of a texture")
    # ranges and defaults as the settings define them (one source; see kiln.settings)
    rng, dflt = settings_mod.allowed_range, settings_mod.Settings()
    r.add_argument("--simplify-ratio", type=float, help="fraction of faces removed, %g-%g (default %g)"
                   % (*rng("mesh.simplify_ratio"), dflt.mesh.simplify_ratio))
    r.add_argument("--faces", type=int, metavar="N",
                   help=f"simplify to N faces (within 2 %%) instead of by --simplify-ratio; refused above "
                        f"the reconstructed mesh's own count or below {MIN_EXACT_FACES}")   # %%: argparse formats help
    r.add_argument("--texture-size", help="texture size in texels, power of two %d-%d, or auto: "
                   "sized so the photo's detail fits (default %s)"
                   % (*rng("bake.texture_size"), dflt.bake.texture_size))
    r.add_argument("--views", type=int, help="number of bake views, %d-%d (default %d)"
                   % (*rng("views.count"), dflt.views.count))
    r.add_argument("--bake-mode", choices=list(settings_mod.allowed_values("bake.mode")),
                   help="texture bake mode (default %s)" % dflt.bake.mode)
    r.add_argument("--seed", type=int, help="random seed, %d-%d (default %d)" % (*rng("seed"), dflt.seed))
    r.add_argument("--ply", action="store_true", help="also write the Gaussians as a 3DGS .ply next to the GLB")
    add_format_flags(r)
    r.add_argument("--device", choices=["auto", "cpu", "cuda"], help="worker device (default auto)")
    r.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override any setting, e.g. --set bake.steps=200 (see `kiln settings`)")
    r.add_argument("--report", metavar="JSON", help="write stage timings and stats to this JSON file")
    r.add_argument("--ray", metavar="ADDRESS", help=settings_mod.RAY_FLAG_HELP)
    r.add_argument("--in-process", action="store_true",
                   help="run the stages in this process instead of a crash-isolated worker (debugging)")
    r.add_argument("--resume", action="store_true",
                   help="take each image already done with the same settings (by an earlier `kiln run`, "
                        "or resumed after a crash) from the job store instead of making it again; "
                        "run the same command again after an interruption")
    r.set_defaults(func=cmd_run)
    add_bake_parser(sub)

    s = sub.add_parser("serve", help="start the web UI (see `kiln serve --help`)", add_help=False)
    s.add_argument("rest", nargs=argparse.REMAINDER)
    s.set_defaults(func=cmd_serve)

    d = sub.add_parser("doctor", help="check Python, torch/CUDA, compilers, backends, checkpoints", add_help=False)
    d.add_argument("rest", nargs=argparse.REMAINDER)
    d.set_defaults(func=cmd_doctor)

    add_models_parser(sub)
    add_jobs_parser(sub)

    st = sub.add_parser("settings", help="list every setting with its default and allowed values")
    st.set_defaults(func=cmd_settings)
    # listed for --help only: main() hands `kiln selftest ...` to worker.checks.selftest, which owns its
    # flags, with the front end's own twin (SAM2)
    sub.add_parser("selftest", help="check each GPU backend against its CPU twin, a job in a worker, "
                                    "recovery from a sticky CUDA error", add_help=False)
    return p


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # before anything imports torch (--in-process, segmentation); workers inherit it (worker.child.env)
    passive_openmp(os.environ)
    if argv[:1] == ["selftest"]:
        from worker.checks.selftest import main as selftest_main

        from app.segment.sam2_selftest import SAM2_TWIN

        return selftest_main(argv[1:], extra_twins=[SAM2_TWIN])
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
    except NoSpace as e:
        print(f"kiln: error: {e}", file=sys.stderr)
        return 1
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
    except OSError as e:
        if not is_no_space(e):
            raise
        print(f"kiln: error: {no_space(Path(e.filename).parent if e.filename else Path.cwd())}",
              file=sys.stderr)
        return 1
    except Exception as e:  # stage validation errors etc.: say what, not a traceback
        from_pipeline = type(e).__name__ in ("StageInputError", "ImageError")
        if not from_pipeline:
            raise
        print(f"kiln: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
