"""``kiln selftest``: every backend this machine can run, checked against its CPU twin.

Checks, each on data it makes itself (the built-in reconstruction of a drawn example):

* gsplat vs Kiln's CPU Gaussian renderer (same cameras, premultiplied colour + alpha);
* nvdiffrast vs moderngl, camera views and UV space (triangle ids, depth, barycentrics);
* the bake on CUDA vs on CPU (same rasterizer, fast mode: deterministic);
* twin checks a front end adds (``TwinCheck``): ``kiln selftest`` adds SAM2 on CUDA vs
  CPU from app/, which owns segmentation (this layer cannot import it);
* one whole job through a spawned worker with the backends the configuration picks here;
* on CUDA, a real sticky CUDA error (a device-side assert from an out-of-range index,
  fault kind ``cuda_assert``) inside a worker: the job fails with it, the worker is
  replaced, and the next job passes.

Every twin check runs in its own spawned process (a crash there is a result, not the
end of the self-test); this process never initialises CUDA. Exit code 1 when a check
the configuration needs fails (a backend it names, or one ``auto`` would pick here),
else 0; skipped checks say why.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import signal
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

# pass criteria; a GPU backend and its CPU twin compute the same thing up to float order
GSPLAT_MEAN_TOL, GSPLAT_P99_TOL = 0.005, 0.05     # |premultiplied rgb / alpha| difference
# the rasterizers' tolerances, and why, are in pipeline.raster.raster_agreement
BAKE_MEAN_TOL, BAKE_P99_TOL = 0.5, 3.0            # texture difference in 8-bit levels
CHILD_TIMEOUT_S = 600.0
# the GPU side of each twin; tests point these at the CPU twins to exercise the comparisons
GPU_DEVICE, GPU_RENDER, GPU_RASTER = "cuda", "gsplat", "nvdiffrast"


@dataclass
class Result:
    check: str
    result: str                       # pass | fail | skip
    max_diff: Optional[float] = None
    gpu_s: Optional[float] = None
    cpu_s: Optional[float] = None
    note: str = ""
    needed: bool = False              # a failure here makes the self-test exit 1


@dataclass(frozen=True)
class TwinCheck:
    """A twin check added by a layer above (worker/ imports nothing from a front end).

    ``run(settings) -> dict`` runs in a spawned child, so it must be a module-level
    function (the child imports it by name); it returns what a CHILD_CHECKS entry does.
    ``skip(settings)`` says why it cannot run here, or None."""

    check: str
    run: Callable
    skip: Callable = lambda settings: None
    needs_cuda: bool = True
    needed: bool = False


# --------------------------------------------------------------------------- test data

def _scene(size: int = 160, views: int = 4, res: int = 160):
    """(image, reconstruction, cameras, mesh with UVs) from the drawn example, seeded."""
    from kiln.examples import draw_object
    from kiln.settings import ReconstructSettings
    from pipeline.camera.cameras import sphere_cameras
    from pipeline.meshing.mesh_ops import simplify_mesh
    from pipeline.recon.reconstruct import reconstruct
    from pipeline.types import ImageInput
    from pipeline.unwrap.uv import unwrap

    rgb, mask = draw_object(size, kind="toy", seed=1)
    image = ImageInput(rgb=rgb, mask=mask)
    recon = reconstruct(image, ReconstructSettings(resolution=64, num_gaussians=8000), seed=0)
    mesh = simplify_mesh(recon.mesh, 0.8)
    mesh = unwrap(mesh, texture_size=256, gutter=2, max_faces=20000)
    cams = sphere_cameras(views, radius=2.4, fov_deg=40.0, resolution=res)
    return image, recon, cams, mesh


def _timed(fn: Callable):
    t0 = time.perf_counter()
    out = fn()
    return out, round(time.perf_counter() - t0, 3)


# --------------------------------------------------------------------------- twin checks (child side)

def _env(_settings) -> dict:
    import importlib.util

    import torch

    from pipeline.raster.rasterize import available_backends

    cuda = bool(torch.cuda.is_available())
    out = {"torch": torch.__version__, "cuda": cuda,
           "device": torch.cuda.get_device_name() if cuda else "cpu",
           "gsplat": importlib.util.find_spec("gsplat") is not None,
           "nvdiffrast": importlib.util.find_spec("nvdiffrast") is not None}
    try:
        out["raster"] = available_backends()
    except Exception as e:  # noqa: BLE001
        out["raster"], out["raster_error"] = [], f"{type(e).__name__}: {e}"
    return out


def _twin_gsplat(_settings) -> dict:
    import numpy as np

    from pipeline.views.render_views import render_gaussians

    _, recon, cams, _ = _scene()
    gpu, gpu_s = _timed(lambda: render_gaussians(recon.gaussians, cams, backend=GPU_RENDER, device=GPU_DEVICE))
    cpu, cpu_s = _timed(lambda: render_gaussians(recon.gaussians, cams, backend="cpu", device="cpu"))
    d = np.concatenate([np.abs(gpu.rgb * gpu.alpha[..., None] - cpu.rgb * cpu.alpha[..., None]).ravel(),
                        np.abs(gpu.alpha - cpu.alpha).ravel()])
    mean, p99 = float(d.mean()), float(np.percentile(d, 99))
    ok = mean <= GSPLAT_MEAN_TOL and p99 <= GSPLAT_P99_TOL
    return {"ok": ok, "max_diff": float(d.max()), "gpu_s": gpu_s, "cpu_s": cpu_s,
            "note": f"{len(cams)} views {cams.width}px, mean {mean:.4f} (<= {GSPLAT_MEAN_TOL}), "
                    f"p99 {p99:.4f} (<= {GSPLAT_P99_TOL})"}


def _twin_raster(kind: str) -> Callable:
    def run(_settings) -> dict:
        from pipeline.raster.raster_agreement import compare
        from pipeline.raster.rasterize import raster_context, rasterize_uv, rasterize_views

        _, _, cams, mesh = _scene(res=256)
        if kind == "views":
            call = lambda rc: rasterize_views(rc, mesh, cams)  # noqa: E731
        else:
            call = lambda rc: rasterize_uv(rc, mesh, 512)  # noqa: E731
        with raster_context(GPU_RASTER, GPU_DEVICE) as gpu_ctx, raster_context("moderngl") as cpu_ctx:
            call(gpu_ctx)   # the first draw builds the plugin: not timed
            gpu, gpu_s = _timed(lambda: call(gpu_ctx))
            cpu, cpu_s = _timed(lambda: call(cpu_ctx))
        agreement = compare(gpu, cpu, depth=kind == "views")
        failures = agreement.failures()
        return {"ok": not failures, "max_diff": agreement.offset_p99_px,
                "gpu_s": gpu_s, "cpu_s": cpu_s,
                "note": f"{mesh.num_faces} faces; " + "; ".join(failures or [agreement.summary()])}
    return run


def _twin_bake(settings) -> dict:
    import numpy as np

    from kiln.settings import BakeSettings
    from pipeline.texture.bake import bake_texture
    from pipeline.raster.rasterize import raster_context
    from pipeline.views.render_views import render_gaussians

    raster = "moderngl" if settings.rasterize.backend != "nvdiffrast" else "nvdiffrast"
    image, recon, cams, mesh = _scene()
    views = render_gaussians(recon.gaussians, cams, backend="cpu", device="cpu")
    bs = BakeSettings(mode="fast", texture_size=256, photo_projection=False)
    with raster_context(raster, "cuda") as rc:   # one rasterizer for both bakes
        (gpu, _), gpu_s = _timed(lambda: bake_texture(mesh, views, bs, rc, GPU_DEVICE, seed=0))
        (cpu, _), cpu_s = _timed(lambda: bake_texture(mesh, views, bs, rc, "cpu", seed=0))
    d = np.abs(gpu.image.astype(np.float64) - cpu.image.astype(np.float64))
    mean, p99 = float(d.mean()), float(np.percentile(d, 99))
    ok = mean <= BAKE_MEAN_TOL and p99 <= BAKE_P99_TOL
    return {"ok": ok, "max_diff": float(d.max()), "gpu_s": gpu_s, "cpu_s": cpu_s,
            "note": f"fast bake 256px via {raster}; mean {mean:.3f} (<= {BAKE_MEAN_TOL}), "
                    f"p99 {p99:.1f} (<= {BAKE_P99_TOL}) levels"}


CHILD_CHECKS = {"env": _env, "gsplat": _twin_gsplat, "raster_views": _twin_raster("views"),
                "raster_uv": _twin_raster("uv"), "bake": _twin_bake}


def _child_main(check, settings_dict: dict, conn) -> None:
    from kiln.settings import from_dict

    try:
        fn = CHILD_CHECKS[check] if isinstance(check, str) else check
        out = fn(from_dict(settings_dict))
    except BaseException as e:  # noqa: BLE001 - reported as the check's failure
        out = {"ok": False, "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-2000:]}
    conn.send(out)
    conn.close()


def run_isolated(check, settings, timeout: float = CHILD_TIMEOUT_S) -> dict:
    """Run ``check`` (a CHILD_CHECKS name, or a module-level function) in a spawned
    process: its result, or {"ok": False, "error": ...} when it crashed, hung past
    ``timeout`` or raised."""
    from worker.child.env import share_extension_env

    share_extension_env()   # the child builds into, and loads from, the workers' cache
    ctx = mp.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    name = check if isinstance(check, str) else check.__name__
    proc = ctx.Process(target=_child_main, args=(check, settings.to_dict(), send),
                       name=f"kiln-selftest-{name}", daemon=True)
    proc.start()
    send.close()
    deadline = time.monotonic() + timeout
    try:
        while True:
            if recv.poll(0.2):
                try:
                    return recv.recv()
                except EOFError:
                    pass   # it died before sending: reported below
            if not proc.is_alive() and not recv.poll(0):
                code = proc.exitcode
                why = (f"crashed with {signal.Signals(-code).name}" if code is not None and code < 0
                       else f"exited with status {code}")
                return {"ok": False, "error": f"the check's process {why}"}
            if time.monotonic() > deadline:
                return {"ok": False, "error": f"timed out after {timeout:g} s"}
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(5)
        recv.close()


def _from_child(check: str, out: dict, needed: bool) -> Result:
    if "error" in out:
        return Result(check, "fail", note=out["error"], needed=needed)
    return Result(check, "pass" if out["ok"] else "fail", out.get("max_diff"), out.get("gpu_s"),
                  out.get("cpu_s"), out.get("note", ""), needed)


# --------------------------------------------------------------------------- whole jobs

def _job_settings(settings, **extra):
    over = {"views.count": 6, "views.resolution": 256, "bake.texture_size": 512, "bake.steps": 30,
            "reconstruct.resolution": 96, "reconstruct.num_gaussians": 12000}
    over.update(extra)
    return settings.override(over)


def _job_check(settings, work: Path) -> Result:
    from kiln.examples import draw_object

    from worker.pool.supervisor import Supervisor

    rgb, mask = draw_object(256, kind="toy", seed=2)
    js = _job_settings(settings)
    t0 = time.perf_counter()
    try:
        with Supervisor(js, work / "jobs", None, var_dir=work) as sup:
            caps = sup.capabilities()
            st = sup.run(rgb, mask, js, session="selftest", timeout=CHILD_TIMEOUT_S)
    except Exception as e:  # noqa: BLE001
        return Result("whole job in a spawned worker", "fail", note=f"{type(e).__name__}: {e}", needed=True)
    took = round(time.perf_counter() - t0, 3)
    used = ", ".join(f"{k} {v}" for k, v in sorted(st.backends.to_dict().items())) if st.backends else ""
    on_gpu = caps is not None and caps.cuda and settings.worker.device != "cpu"
    res = Result("whole job in a spawned worker", "pass" if st.state == "done" else "fail",
                 gpu_s=took if on_gpu else None, cpu_s=None if on_gpu else took,
                 note=(f"backends: {used}" if st.state == "done" else f"{st.state}: {st.error}"),
                 needed=True)
    return res


def _sticky_cuda_check(settings, work: Path) -> Result:
    """A real device-side assert inside a worker: that job fails as a CUDA error, the
    worker is replaced, the next job on the same supervisor passes."""
    from kiln.examples import draw_object

    from worker.child.faults import FaultPlan
    from worker.pool.supervisor import Supervisor

    name = "sticky CUDA error replaces the worker"
    js = _job_settings(settings, **{"worker.retry_with_fallback": False, "worker.count": 1,
                                   "worker.device": "cuda"})
    rgb, mask = draw_object(256, kind="toy", seed=3)
    plan = FaultPlan(["cuda_assert@render_views:session=selftest-sticky"])
    t0 = time.perf_counter()
    try:
        with Supervisor(js, work / "jobs", None, var_dir=work, faults=plan) as sup:
            pid0 = sup.workers()[0]["pid"]
            bad = sup.run(rgb, mask, js, session="selftest-sticky", timeout=CHILD_TIMEOUT_S)
            good = sup.run(rgb, mask, js, session="selftest-after", timeout=CHILD_TIMEOUT_S)
            w = sup.workers()[0]
    except Exception as e:  # noqa: BLE001
        return Result(name, "fail", note=f"{type(e).__name__}: {e}", needed=True)
    took = round(time.perf_counter() - t0, 3)
    problems = []
    if bad.state != "failed" or "CUDA error" not in (bad.error or "") or \
            "device-side assert" not in (bad.error or ""):
        problems.append(f"the faulted job ended {bad.state}: {bad.error}")
    if w["pid"] == pid0 or w["restarts"] < 1:
        problems.append("the worker was not replaced")
    if good.state != "done":
        problems.append(f"the next job ended {good.state}: {good.error}")
    note = "; ".join(problems) if problems else \
        f"device-side assert -> worker {pid0} replaced by {w['pid']}; next job done"
    return Result(name, "fail" if problems else "pass", gpu_s=took, note=note, needed=True)


# --------------------------------------------------------------------------- driver

def _needs(settings, cuda: bool, env: dict) -> dict:
    """Which GPU checks the configuration relies on here: a backend it names, or the one
    ``auto`` picks when it is installed (a broken one would be picked), by the rule jobs
    use (``pipeline.backends.needed_capabilities``)."""
    from kiln.records import Capabilities
    from pipeline.backends import needed_capabilities

    need = needed_capabilities(settings, Capabilities(cuda=cuda, gsplat=bool(env.get("gsplat")),
                                                      nvdiffrast=bool(env.get("nvdiffrast"))))
    return {"gsplat": "gsplat" in need, "nvdiffrast": "nvdiffrast" in need,
            "bake": settings.bake.enabled and "cuda" in need}


def run_selftest(settings, work_dir: Optional[Path] = None, skip_jobs: bool = False,
                 log: Callable[[str], None] = lambda m: None,
                 extra_twins: Sequence[TwinCheck] = ()) -> list[Result]:
    results: list[Result] = []
    log("probing this machine (in a spawned process)")
    env = run_isolated("env", settings, timeout=300)
    if "error" in env:
        return [Result("environment", "fail", note=env["error"], needed=True)]
    cuda = bool(env["cuda"])
    device_ok = cuda and settings.worker.device != "cpu"
    no_cuda = ("worker.device is cpu" if cuda else
               f"no CUDA device visible to torch {env['torch']} (torch.cuda.is_available() is False)")
    needs = _needs(settings, cuda, env)
    log(f"torch {env['torch']}, device {env['device']}, rasterizers {env.get('raster')}")

    def twin(check: str, child, needed: bool, skip: Optional[str]):
        if skip:
            results.append(Result(check, "skip", note=skip, needed=needed))
            if needed:   # the configuration names a backend this machine cannot run
                results[-1].result = "fail"
                results[-1].note = f"the configuration needs it, but it cannot run here: {skip}"
            return
        log(f"running {check}")
        results.append(_from_child(check, run_isolated(child, settings), needed))

    twin("gsplat vs CPU Gaussian renderer", "gsplat", needs["gsplat"],
         None if device_ok and env["gsplat"] else (no_cuda if not device_ok else "gsplat is not installed"))
    raster_skip = None
    if not device_ok:
        raster_skip = no_cuda
    elif not env["nvdiffrast"]:
        raster_skip = "nvdiffrast is not installed (pip install diffrp-nvdiffrast==0.3.3.1)"
    elif "moderngl" not in env.get("raster", []):
        raster_skip = f"moderngl/EGL is not available as the CPU twin: {env.get('raster_error', 'probe failed')}"
    twin("nvdiffrast vs moderngl, camera views", "raster_views", needs["nvdiffrast"], raster_skip)
    twin("nvdiffrast vs moderngl, UV space", "raster_uv", needs["nvdiffrast"], raster_skip)
    twin("bake on CUDA vs CPU", "bake", needs["bake"], None if device_ok else no_cuda)
    for extra in extra_twins:
        skip = extra.skip(settings) or (no_cuda if extra.needs_cuda and not cuda else None)
        twin(extra.check, extra.run, extra.needed, skip)

    if skip_jobs:
        results.append(Result("whole job in a spawned worker", "skip", note="--skip-jobs"))
        results.append(Result("sticky CUDA error replaces the worker", "skip", note="--skip-jobs"))
        return results
    with tempfile.TemporaryDirectory(prefix="kiln-selftest-", dir=work_dir) as tmp:
        log("running one whole job through a spawned worker")
        results.append(_job_check(settings, Path(tmp) / "job"))
        if device_ok:
            log("provoking a device-side assert inside a worker")
            results.append(_sticky_cuda_check(settings, Path(tmp) / "sticky"))
        else:
            results.append(Result("sticky CUDA error replaces the worker", "skip", note=no_cuda))
    return results


def exit_code(results: list[Result]) -> int:
    return 1 if any(r.result == "fail" and r.needed for r in results) else 0


def format_table(results: list[Result]) -> str:
    def num(v, fmt):
        return "-" if v is None else format(v, fmt)

    rows = [("check", "result", "max diff", "GPU s", "CPU s")]
    rows += [(r.check, r.result.upper() if r.result == "fail" else r.result, num(r.max_diff, ".3g"),
              num(r.gpu_s, ".2f"), num(r.cpu_s, ".2f")) for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    notes = [f"  {r.check}: {r.note}" for r in results if r.note and r.result != "skip"]
    skips = [f"  {r.check}: {r.note}" for r in results if r.result == "skip"]
    out = "\n".join(lines)
    if notes:
        out += "\n\nDetails:\n" + "\n".join(notes)
    if skips:
        out += "\n\nSkipped:\n" + "\n".join(skips)
    failed = [r.check for r in results if r.result == "fail"]
    code = exit_code(results)
    out += "\n\n" + ("selftest: ok" if not failed else
                     f"selftest: {len(failed)} failed ({', '.join(failed)})"
                     + ("" if code else "; none of them is needed by this configuration"))
    return out


def main(argv=None, extra_twins: Sequence[TwinCheck] = ()) -> int:
    """``kiln selftest``; ``extra_twins``: the front end's own twin checks."""
    import argparse
    import sys

    from kiln import settings as settings_mod

    p = argparse.ArgumentParser(prog="kiln selftest", description=(
        "Check every backend this machine can run against its CPU twin, run one job through a "
        "spawned worker and (on CUDA) show a worker survives a real sticky CUDA error. Exit code 1 "
        "when something the configuration needs fails."))
    p.add_argument("--config", help="settings YAML (default: configs/default.yaml)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a setting")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--skip-jobs", action="store_true", help="only the backend comparisons")
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    args = p.parse_args(argv)
    try:
        settings = settings_mod.load(args.config, settings_mod.parse_set(args.set))
    except settings_mod.SettingsError as e:
        print(f"kiln selftest: {e}", file=sys.stderr)
        return 2
    log = (lambda m: None) if args.json else (lambda m: print(f"... {m}", file=sys.stderr, flush=True))
    results = run_selftest(settings, skip_jobs=args.skip_jobs, log=log, extra_twins=extra_twins)
    code = exit_code(results)
    if args.json:
        print(json.dumps({"exit_code": code, "results": [asdict(r) for r in results]}, indent=2))
    else:
        print(format_table(results))
    return code


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
