"""The worker process: owns the only CUDA (and GL) context, runs one job at a time.

Started by the supervisor with the ``spawn`` start method, so it begins as a fresh
interpreter that inherited no handles. ``worker_main`` first fixes the
environment (``worker.child.env.prepare``: CUDA toolkit matching torch, extension
directory, faulthandler), sends its output to a per-worker log, probes the
backends, reports ``ready`` with its capabilities, then serves jobs from its
inbox until told to stop.

Messages both ways are the dataclasses of ``worker.messages``. The worker's are
small (see ``Sender``): a pickled message stays under PIPE_BUF, so it reaches the
pipe whole or not at all even when the process dies right after sending, and the
supervisor can never block on half a message. Everything big goes through the job
directory.

This module is imported by the app process too (the spawn target is pickled by
reference), so it imports nothing heavy at module level.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import gc
import json
import os
import pickle
import re
import signal
import sys
import threading
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Optional

from kiln.records import CameraFitReport, Capabilities, JobTimes, PipelineStats, WorkerReport

from worker.messages import Done, ErrorKind, Failed, Heartbeat, Probing, Progress, Ready, Run, Started, Stop
from worker.child.workerconfig import WorkerConfig

if TYPE_CHECKING:
    from kiln.records import Backends
    from kiln.settings import Settings
    from pipeline.raster.rasterize import RasterContext

EXIT_CUDA_STICKY = 75      # "please give me a fresh process": a CUDA error poisoned this one
MAX_MESSAGE_BYTES = 3800   # < PIPE_BUF (4096) so a write is atomic

_CUDA_ERROR_RE = re.compile(
    r"CUDA error|CUDA driver error|CUDA_ERROR|cuDNN error|CUDNN_STATUS|CUBLAS_STATUS|cuBLAS error|"
    r"illegal memory access|device-side assert|unspecified launch failure|misaligned address|"
    r"illegal instruction was encountered|NCCL error", re.I)


def classify_error(exc: BaseException) -> ErrorKind:
    """'oom' | 'cuda' (sticky, process must go) | 'input' (bad data/settings) | 'error'."""
    text = f"{exc}"
    if type(exc).__name__ == "OutOfMemoryError" or ("out of memory" in text.lower()
                                                    and "cuda" in text.lower()):
        return "oom"
    if _CUDA_ERROR_RE.search(text):
        return "cuda"
    try:
        from pipeline.validate import StageInputError

        if isinstance(exc, StageInputError):
            return "input"
    except ImportError:
        pass
    return "error"


def _shrink(obj, limit: int):
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: _shrink(getattr(obj, f.name), limit)
                                           for f in dataclasses.fields(obj)})
    if isinstance(obj, str):
        return obj if len(obj) <= limit else obj[: limit - 3] + "..."
    if isinstance(obj, dict):
        return {k: _shrink(v, limit) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_shrink(v, limit) for v in obj)
    return obj


class Sender:
    """Thread-safe, size-capped, synchronous ``put`` onto the worker's outbox."""

    def __init__(self, queue):
        self.queue = queue

    def __call__(self, msg) -> None:
        for limit in (1500, 300, 80):
            if len(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)) <= MAX_MESSAGE_BYTES:
                break
            msg = _shrink(msg, limit)
        self.queue.put(msg)  # SimpleQueue: written to the pipe before put returns


# --------------------------------------------------------------------------- start-up


def _redirect_output(log_path: Path):
    """Point fds 1 and 2 (so native libraries' prints and faulthandler too) at the log."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    if log_path.is_file() and log_path.stat().st_size > 20_000_000:
        os.replace(log_path, log_path.with_suffix(".log.1"))
    f = open(log_path, "a", buffering=1, encoding="utf-8", errors="replace")
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(f.fileno(), 1)
    os.dup2(f.fileno(), 2)
    faulthandler.enable(file=f, all_threads=True)
    # SIGTERM is how the supervisor stops a hung worker: dump every thread's stack
    # first (that is where the hang is), then die the default way.
    faulthandler.register(signal.SIGTERM, file=f, all_threads=True, chain=True)
    return f


def _heartbeat(send: Sender, interval: float, parent_pid: int) -> None:
    while True:
        time.sleep(interval)
        if os.getppid() != parent_pid:
            os._exit(0)  # the supervisor is gone; nobody will ever read our results
        send(Heartbeat(time.time()))


def _probe_all(cfg: WorkerConfig, send: Sender, env_notes: dict[str, Any]) -> Capabilities:
    from worker.child.probe import PROBES, run_probe

    ctx: dict[str, Any] = {"device": cfg.device, "results": {}, "settings": cfg.settings}
    reasons: dict[str, str] = {}
    times: dict[str, float] = {}
    for name in PROBES:
        if name in cfg.skip_probes:
            ctx["results"][name] = False
            reasons[name] = cfg.skip_probes[name]
            continue
        send(Probing(name))
        _startup_fault(cfg, name)
        t0 = time.perf_counter()
        ok, reason = run_probe(name, ctx, cfg.probe_timeout_s)
        times[name] = round(time.perf_counter() - t0, 3)
        if not ok:
            reasons[name] = reason
        print(f"probe {name}: {'ok' if ok else reason} ({times[name]} s)", flush=True)
    # No probe runs from here on: a crash now is not that backend's fault.
    send(Probing(None))
    r = ctx["results"]
    return Capabilities(
        device=str(ctx.get("device_name", "cpu")) if r.get("cuda") else "cpu",
        cuda=bool(r.get("cuda")), cpu=bool(r.get("cpu")), moderngl=bool(r.get("moderngl")),
        gsplat=bool(r.get("gsplat")), nvdiffrast=bool(r.get("nvdiffrast")), sam3d=bool(r.get("sam3d")),
        reasons=reasons, probe_s=times,
        torch_cuda=env_notes.get("torch_cuda"), toolkit=env_notes.get("toolkit"),
        torch_extensions_dir=env_notes.get("torch_extensions_dir"),
        torch_cuda_arch_list=env_notes.get("torch_cuda_arch_list"),
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        python=sys.executable, python_prefix=sys.prefix)   # worker.python shows here


# Libraries the stages import lazily (inside functions, to keep the app and CLI fast).
# A worker imports them right after it says "ready", before it reads its first
# message, so the first job after a (re)start does not pay ~1.5 s of imports in the middle
# of a stage, and "ready" (which the supervisor waits for) does not wait for them. (On this
# main thread: a library imported on another thread while a stage runs is visible half-made
# in sys.modules, and scipy reads torch from there.)
_STAGE_LIBRARIES = ("trimesh", "trimesh.exchange.gltf", "scipy.ndimage", "scipy.sparse.linalg",
                    "scipy.sparse.csgraph", "scipy.spatial", "scipy.spatial.transform",
                    "skimage.measure", "cv2", "xatlas", "pyfqmr", "plyfile", "PIL.PngImagePlugin")


def _startup_fault(cfg: WorkerConfig, step: str) -> None:
    """Tests only: fire a ``KIND@probe:STEP`` fault (a probe name, or ``imports``)."""
    kind = cfg.probe_fault(step)
    if kind:
        from worker.child import faults

        print(f"test fault '{kind}' fires in start-up step {step}", flush=True)
        faults.fire(kind)


def _import_pipeline(cfg: WorkerConfig) -> None:
    """The pipeline's own modules (light: they import their libraries lazily). Before
    "ready", so a broken pipeline is reported in the capabilities."""
    import importlib

    _startup_fault(cfg, "imports")

    for mod in ("run", "recon.reconstruct", "recon.builtin", "views.render_views", "meshing.mesh_ops", "unwrap.uv",
                "raster.rasterize", "texture.bake", "io.export", "cache", "texture.model_bake",
                "texture.model_inputs"):
        importlib.import_module(f"pipeline.{mod}")


def _warm_imports() -> None:
    import importlib

    # not torch: on a machine without a GPU no stage of a default job imports it (the renderer,
    # the photo projection and the bake run in numpy and compiled loops), and a GPU worker's
    # probes imported it already; so a CPU worker never loads it (~2 s, ~500 MB) unless a
    # job asks for what needs it (SAM 3D)
    for lib in _STAGE_LIBRARIES:
        try:
            importlib.import_module(lib)
        except ImportError as e:  # the stage that needs it will say so in its own words
            print(f"warm-up: cannot import {lib}: {e}", flush=True)


def worker_main(cfg: WorkerConfig, inbox: Any, outbox: Any) -> None:
    """Entry point of a spawned worker. ``cfg`` is built by the supervisor."""
    from worker.child.interpreter import adopt_path

    adopt_path(cfg.interpreter)   # under worker.python: that interpreter's sys.path, before any import
    from worker.child import env as env_mod

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the supervisor's business
    env_notes = env_mod.prepare(os.environ, cfg.gpu, cfg.device)
    _redirect_output(Path(cfg.log_path))
    print(f"--- worker {cfg.slot} pid {os.getpid()} starting {time.strftime('%Y-%m-%d %H:%M:%S')} "
          f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r} "
          f"toolkit: {env_notes.get('toolkit')}", flush=True)
    send = Sender(outbox)
    threading.Thread(target=_heartbeat, args=(send, cfg.heartbeat_s, cfg.parent_pid),
                     name="heartbeat", daemon=True).start()
    t0 = time.perf_counter()
    caps = _probe_all(cfg, send, env_notes)
    try:
        _import_pipeline(cfg)
    except Exception as e:  # jobs will fail with the same error, and say so
        caps = replace(caps, pipeline_error=f"{type(e).__name__}: {e}")
        traceback.print_exc()
    startup_s = round(time.perf_counter() - t0, 3)
    send(Ready(os.getpid(), caps, startup_s))
    t1 = time.perf_counter()
    _warm_imports()
    print(f"ready after {startup_s} s; stage libraries imported in {time.perf_counter() - t1:.3f} s",
          flush=True)
    # rasterizer contexts live on this (main) thread for the worker's life, one per
    # (backend, device): made by the first job that bakes, released after a failure
    contexts: dict[tuple[str, str], RasterContext] = {}
    while True:
        msg = inbox.get()
        if isinstance(msg, Stop):
            break
        if isinstance(msg, Run):
            _run_job(msg, cfg, caps, send, contexts)
    _release_contexts(contexts)
    print(f"--- worker {cfg.slot} pid {os.getpid()} stopping", flush=True)
    _exit_now()


def _exit_now() -> None:
    """End the process without the interpreter's teardown. Everything this worker made is
    on disk already (jobs are written atomically, the log flushed) and its messages are in
    the pipe (a SimpleQueue writes before ``put`` returns); what teardown would do after a
    Stop is free torch's, Mesa's and numpy's memory one object at a time: 0.5-0.8 s measured
    on the 2-core machine, which ``kiln run`` waited for after every model."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# --------------------------------------------------------------------------- jobs


def _check_backends(settings: Settings, backends: Backends, caps: Capabilities) -> None:
    """Explicit backend settings this worker cannot honour fail the job up front, clearly."""
    from pipeline.backends import unmet_requirements
    from pipeline.validate import StageInputError

    problem = unmet_requirements(settings, backends, caps)
    if problem:
        raise StageInputError(problem)


def _json_default(o: Any) -> Any:
    return o.item() if hasattr(o, "item") else str(o)


def _raster_context(contexts: dict[tuple[str, str], RasterContext], backends: Backends) -> RasterContext:
    from pipeline.raster.rasterize import raster_context

    key = (backends.rasterize, backends.device)
    if key not in contexts:
        contexts[key] = raster_context(*key)
    return contexts[key]


def _release_contexts(contexts: dict[tuple[str, str], RasterContext]) -> None:
    for rc in contexts.values():
        try:
            rc.release()
        except Exception:  # noqa: BLE001 - best effort; the process may be on its way out
            pass
    contexts.clear()


def _run_job(msg: Run, cfg: WorkerConfig, caps: Capabilities, send: Sender,
             contexts: dict[tuple[str, str], RasterContext]) -> None:
    from kiln.atomic import atomic_write

    from worker.child import faults
    from worker.jobs.jobstore import append_log, load_settings

    job_id, job_dir, attempt = msg.job, Path(msg.dir), msg.attempt
    fault = msg.fault if cfg.faults_enabled else None
    fault_kind, fault_stage = faults.split_spec(fault) if fault else (None, None)
    stage_now: Optional[str] = None   # the stage running (None before the first)
    last_sent = 0.0                   # when its last Progress went out (monotonic)
    t_job = time.perf_counter()
    print(f"=== job {job_id} attempt {attempt} ===", flush=True)
    note = f" with {msg.overrides}" if msg.overrides else ""
    if msg.chunk_scale < 1.0:
        note += f", chunk scale {msg.chunk_scale:g}"
    append_log(job_dir, f"worker {cfg.slot} (pid {os.getpid()}): attempt {attempt}{note}")

    def on_event(stage: str, fraction: float, message: str = "") -> None:
        nonlocal stage_now, last_sent
        now = time.monotonic()
        new = stage != stage_now
        if new:
            stage_now = stage
            append_log(job_dir, f"stage {stage}: started")
        if new or fraction >= 1.0 or now - last_sent >= 0.1:
            last_sent = now
            send(Progress(job_id, stage, float(fraction), str(message)[:200]))
        if new and fault_kind is not None and fault_stage == stage:
            append_log(job_dir, f"test fault '{fault_kind}' fires at stage {stage}")
            faults.fire(fault_kind, str(job_dir))

    try:
        from pipeline.run import resolve_backends

        settings = load_settings(job_dir).override(msg.overrides or {})
        # the out-of-memory retry shrinks the stages' memory-bound blocks (chunk_scale)
        backends = resolve_backends(settings, caps, chunk_scale=msg.chunk_scale)
        send(Started(job_id, backends))
        _check_backends(settings, backends, caps)
        run = _fit_job if msg.kind == "fit" else _model_job
        got = run(msg, settings, backends, contexts, on_event)
        # what the pipeline itself took vs. the whole attempt in this worker (inputs, checks)
        job_times = JobTimes(pipeline_s=round(got.pipeline_s, 4),
                             worker_job_s=round(time.perf_counter() - t_job, 4),
                             worker_peak_rss_mb=round(_peak_rss_mb(), 1))
        report = WorkerReport(timings=got.timings, job=job_times, stats=got.stats, check=got.check,
                              camera_fit=got.camera_fit)
        atomic_write(job_dir / "result.json",
                     json.dumps(report.to_dict(), indent=1, default=_json_default).encode())
        append_log(job_dir, "done: " + ", ".join(f"{k} {v:.2f}s" for k, v in got.timings.items()))
        send(got.done)
    except Exception as e:
        kind = classify_error(e)
        tb = traceback.format_exc()
        print(tb, flush=True)
        append_log(job_dir, f"stage {stage_now}: {kind} error\n{tb}")
        send(Failed(job_id, stage_now, kind, f"{type(e).__name__}: {e}".strip()))
        if kind == "cuda":
            # The CUDA context is poisoned for good; only a new process gets a clean one.
            sys.stdout.flush()
            os._exit(EXIT_CUDA_STICKY)
        del e
        _release_contexts(contexts)   # the next job starts from fresh GL / CUDA rasterizer state
        _free_memory()


class _Attempt(NamedTuple):
    """What an attempt that ended well reports: its ``WorkerReport``'s parts and its ``Done``."""

    timings: dict[str, float]
    stats: PipelineStats
    check: dict[str, Any]
    camera_fit: Optional[CameraFitReport]
    done: Done
    pipeline_s: float


def _model_job(msg: Run, settings: Settings, backends: Backends, contexts, on_event) -> _Attempt:
    """An image job or a bake job: a GLB, checked."""
    from pipeline.io.export import check_glb

    job_dir = Path(msg.dir)
    t_pipe = time.perf_counter()
    if msg.kind == "bake":   # the job's kind is in its record (the store's, sent in Run)
        from worker.jobs.bakejob import bake_folder

        result = bake_folder(job_dir, settings, backends, _raster_context(contexts, backends), on_event,
                             job_dir / "outputs")
    else:
        result = _reconstruct(job_dir, settings, backends, contexts, msg, on_event)
    pipeline_s = time.perf_counter() - t_pipe
    done = Done(msg.job, str(result.glb_path), str(result.ply_path) if result.ply_path else None,
                {k: str(v) for k, v in result.extra.items()})
    return _Attempt(dict(result.timings), result.stats, dict(check_glb(result.glb_path)), None, done, pipeline_s)


def _fit_job(msg: Run, settings: Settings, backends: Backends, contexts, on_event) -> _Attempt:
    """A fit job: the photo's camera fitted to its mask, written with its picture; no GLB."""
    from worker.jobs.bakejob import fit_folder

    job_dir = Path(msg.dir)
    t_pipe = time.perf_counter()
    result = fit_folder(job_dir, backends, _raster_context(contexts, backends), on_event, job_dir / "outputs")
    done = Done(msg.job, None, None, {"camera": str(result.camera), "camera_fit": str(result.picture)})
    return _Attempt(result.timings, PipelineStats(backends=backends), {}, result.report, done,
                    time.perf_counter() - t_pipe)


def _reconstruct(job_dir: Path, settings: Settings, backends: Backends, contexts, msg: Run, on_event):
    """An image job: the photo reconstructed, meshed, baked and exported."""
    from pipeline.run import run_pipeline
    from pipeline.types import ImageInput

    from worker.jobs.jobstore import load_inputs, load_more_masks

    rgb, mask = load_inputs(job_dir)
    more = load_more_masks(job_dir)
    cache_dir = Path(msg.cache_dir) if msg.cache_dir else None
    if more:   # several objects of the photo: one scene, laid out by the reconstruction
        from pipeline.scene.photo_scene import bake_photo_scene

        return bake_photo_scene(rgb, [mask, *more], settings, backends, job_dir / "outputs",
                                _raster_context(contexts, backends), on_event=on_event, name="model",
                                cache_dir=cache_dir).bake
    raster_ctx = _raster_context(contexts, backends) if settings.bake.enabled else None
    return run_pipeline(ImageInput(rgb=rgb, mask=mask), settings, job_dir / "outputs",
                        on_event=on_event, backends=backends, cache_dir=cache_dir,
                        name="model", raster_ctx=raster_ctx)


def _peak_rss_mb() -> float:
    """This worker's peak resident memory so far (a job's own in a fresh worker)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0   # KiB on Linux


def _free_memory() -> None:
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
