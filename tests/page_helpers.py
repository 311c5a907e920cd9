"""A page and an app context without a server, for the handlers' and the API's unit tests:
a supervisor stand-in whose jobs advance one step per status call and end with a real
GLB-named file, browsers with known cookies, and the outputs the wiring declares."""

from __future__ import annotations

import io
import json
import threading
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from PIL import Image

from app.web.server import browser
from app.web.server.context import AppContext
from app.web.server.requestinfo import Caller
from app.segment.segment import GrabCutSegmenter, SegmenterChoice
from kiln.records import JobStats, OutputFile, PipelineStats
from worker.jobs.jobstore import JobStatus

ALICE, BOB = "a" * 43, "b" * 43   # two browsers' cookies


def caller(token: str | None = ALICE, tab: str = "tab1", client: str = "127.0.0.1") -> Caller:
    return Caller(browser.session_name(token, tab), client)


def png_file(folder: Path, name: str, arr: np.ndarray) -> str:
    path = Path(folder) / name
    Image.fromarray(arr).save(path)
    return str(path)


def png_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


class FakeJob:
    """A ``worker.pool.jobhandle.Job``'s calls, answered by ``FakeSup``."""

    def __init__(self, sup: "FakeSup", job_id: str):
        self.sup, self.id = sup, job_id
        self.dir = sup.dirs[job_id]

    def status(self) -> JobStatus:
        return self.sup.status(self.id)

    def cancel(self, timeout: float = 5.0, reason: str = "") -> bool:
        return self.sup.cancel(self.id, reason)


class FakeSup:
    """What AppContext and the handlers use of a supervisor. A job runs ``steps`` status
    calls in stage 'mesh', then ends: done with a GLB (and a .ply when asked), or as
    ``fail_with`` says. ``hold``: jobs stay running until released. Job directories, with
    their settings.json, live under ``root``."""

    def __init__(self, root: Path, steps: int = 2, refuse: Exception | None = None):
        self.root, self.steps, self.refuse = Path(root), steps, refuse
        self.statuses: dict[str, JobStatus] = {}
        self.dirs: dict[str, Path] = {}
        self.calls: dict[str, int] = {}
        self.cancelled: list[str] = []
        self.fail_with: str | None = None
        self.hold = False
        self.lock = threading.Lock()
        self.queued = 0
        # waiting: submitted jobs stay queued; ahead: other clients' jobs queued before them
        self.waiting = False
        self.ahead = 0
        self.busy: list[JobStatus] = []    # other clients' jobs running on the workers
        self.ply: dict[str, bool] = {}     # job id -> a .ply was asked for
        self.export: dict = {}             # job id -> its settings' export section
        self.bakes: dict = {}              # job id -> the CheckedBake of a bake job
        self.masks: dict = {}              # job id -> an image job's masks, the first object's first

    # the pool
    def start(self):
        return self

    def shutdown(self):
        pass

    def capabilities(self):
        from kiln.records import Capabilities

        return Capabilities(device="cpu", cpu=True, moderngl=True)

    def queue_length(self) -> int:
        return self.queued

    def load(self) -> tuple[int, int]:
        with self.lock:
            states = [st.state for st in self.statuses.values()]
        return states.count("running"), self.queued + self.ahead + states.count("queued")

    def running(self) -> list[JobStatus]:
        with self.lock:
            return list(self.busy) + [st for st in self.statuses.values() if st.state == "running"]

    def queue_place(self, job_id: str):
        with self.lock:
            queued = [i for i, st in self.statuses.items() if st.state == "queued"]
        return self.ahead + queued.index(job_id) + 1 if job_id in queued else None

    # jobs
    def submit(self, rgb, mask, settings, session, more_masks=()):
        """``more_masks[job id]`` keeps a scene job's other objects' masks."""
        if self.refuse is not None:
            raise self.refuse
        assert rgb.dtype == np.uint8 and mask.dtype == bool and rgb.shape[:2] == mask.shape
        assert all(m.dtype == bool and m.shape == mask.shape for m in more_masks)
        with self.lock:
            job_id = f"job{len(self.statuses)}"
            self.masks[job_id] = (mask, *more_masks)
            d = self.root / session / job_id
            (d / "outputs").mkdir(parents=True)
            (d / "settings.json").write_text(json.dumps(settings.to_dict()))
            self.dirs[job_id] = d
            self.statuses[job_id] = JobStatus(id=job_id, session=session, state="queued", seq=1,
                                              created=1000.0 + len(self.statuses))
            self.ply[job_id] = bool(settings.export.gaussians_ply)
            self.export[job_id] = settings.export
        return FakeJob(self, job_id)

    def submit_bake(self, bake, settings, session, kind: str = "bake"):
        """A bake job: ``bakes[job id]`` keeps the ``worker.jobs.bakeinputs.CheckedBake`` it got."""
        if self.refuse is not None:
            raise self.refuse
        with self.lock:
            job_id = f"job{len(self.statuses)}"
            d = self.root / session / job_id
            (d / "outputs").mkdir(parents=True)
            (d / "settings.json").write_text(json.dumps(settings.to_dict()))
            self.dirs[job_id] = d
            self.statuses[job_id] = JobStatus(id=job_id, session=session, kind=kind, state="queued", seq=1,
                                              created=1000.0 + len(self.statuses))
            self.ply[job_id] = False
            self.export[job_id] = settings.export
            self.bakes[job_id] = bake
        return FakeJob(self, job_id)

    def submit_fit(self, fit, settings, session):
        """A fit job (the camera alone): it ends with a camera.json in the fit's form (a focal
        length of ``fit_focal`` px for a mesh in the OpenGL camera frame, at the photo's size),
        a picture, and ``fit_iou`` as its silhouette IoU."""
        assert fit.request.photo and fit.rgb is not None
        return self.submit_bake(fit, settings, session, kind="fit")

    def job(self, job_id: str) -> FakeJob:
        if job_id not in self.statuses:
            raise KeyError(job_id)
        return FakeJob(self, job_id)

    def jobs(self, session=None) -> list[JobStatus]:
        with self.lock:
            out = list(self.statuses.values())
        return [st for st in out if session is None or st.session == session]

    def status(self, job_id: str) -> JobStatus:
        with self.lock:
            st = self.statuses[job_id]
            if st.terminal or (self.waiting and st.state == "queued"):
                return st
            n = self.calls[job_id] = self.calls.get(job_id, 0) + 1
            if n <= self.steps or self.hold:
                st = replace(st, state="running", stage="mesh", seq=st.seq + 1 if n <= self.steps else st.seq,
                             progress=min(0.9, 0.1 * n), message="mesh: simplifying")
            else:
                st = self._end(st)
            self.statuses[job_id] = st
            return st

    def _end(self, st: JobStatus) -> JobStatus:
        if self.fail_with:
            return replace(st, state="failed", seq=st.seq + 1, error=self.fail_with, finished=st.created + 3)
        if st.kind == "fit":
            return self._fitted(st)
        out = self.dirs[st.id] / "outputs"
        (out / "model.glb").write_bytes(b"glTF" + st.id.encode())
        outputs = {"glb": str(out / "model.glb")}
        if self.ply.get(st.id):
            (out / "model.ply").write_bytes(b"ply\n" + st.id.encode())
            outputs["ply"] = str(out / "model.ply")
        stats = JobStats()
        export = self.export.get(st.id)
        if export is not None and len(export.formats) > 1:
            files = extra_outputs(out, export)
            outputs.update({f.key: str(out / f.name) for f in files})
            glb = OutputFile(key="glb", name="model.glb", bytes=(out / "model.glb").stat().st_size)
            stats = JobStats(pipeline=PipelineStats(files=(glb, *files)))
        return replace(st, state="done", stage="export", progress=1.0, seq=st.seq + 1, outputs=outputs,
                       timings={"total_s": 2.0, "queued_s": 0.0}, finished=st.created + 2, stats=stats)

    fit_iou = 0.93
    fit_focal = 300.0

    def _fitted(self, st: JobStatus) -> JobStatus:
        from kiln.records import CameraFitReport
        from pipeline.io.camera_file import camera_from_focal

        h, w = self.bakes[st.id].rgb.shape[:2]
        camera = camera_from_focal(self.fit_focal, w, h).to_dict()
        report = CameraFitReport(source_camera=camera, iou=self.fit_iou, coverage=0.98, inside=0.9, objective=0.9,
                                 seconds=1.7, case="posed")
        out = self.dirs[st.id] / "outputs"
        (out / "camera.json").write_text(json.dumps(report.to_dict()))
        picture = np.zeros((h, w, 3), np.uint8)
        picture[h // 4: 3 * h // 4, w // 4: 3 * w // 4] = (60, 120, 255)
        Image.fromarray(picture).save(out / "camera_fit.png")
        return replace(st, state="done", stage="fit", progress=1.0, seq=st.seq + 1,
                       outputs={"camera": str(out / "camera.json"), "camera_fit": str(out / "camera_fit.png")},
                       timings={"total_s": 2.0, "queued_s": 0.0}, finished=st.created + 2,
                       stats=JobStats(camera_fit=report))

    def cancel(self, job_id: str, reason: str = "") -> bool:
        with self.lock:
            self.cancelled.append(job_id)
            st = self.statuses[job_id]
            if not st.terminal:
                self.statuses[job_id] = replace(st, state="cancelled", seq=st.seq + 1,
                                                error=reason or "cancelled by user")
        return True


def extra_outputs(out: Path, export) -> tuple:
    """The formats of ``export`` besides the GLB, written for real (``pipeline.io.mesh_formats``)
    from a small textured tetrahedron into ``out`` as a job names them: its OutputFiles."""
    from kiln.formats import output_key, output_name
    from pipeline.io import mesh_formats
    from pipeline.types import Mesh, Texture

    mesh = Mesh(np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1]], np.float32) - 0.25,
                np.array([[0, 2, 1], [0, 1, 3], [0, 3, 2], [1, 2, 3]], np.int32),
                uvs=np.array([[0.1, 0.1], [0.9, 0.1], [0.1, 0.9], [0.9, 0.9]], np.float32))
    tex = Texture(np.full((8, 8, 3), 120, np.uint8), np.ones((8, 8), bool))
    files = []
    for fmt in export.formats[1:]:
        key = output_key(fmt)
        path = out / output_name("model", key)
        if key == "obj":
            files.append(mesh_formats.export_obj_zip(mesh, tex, path, export.texture_format))
        elif key == "stl":
            files.append(mesh_formats.export_stl(mesh, path, export.units))
        else:
            files.append(mesh_formats.export_mesh_ply(mesh, tex, path))
    return tuple(files)


def make_context(tmp_path: Path, settings, sup: FakeSup | None = None, start: bool = True) -> AppContext:
    """An AppContext around ``sup`` with GrabCut segmentation and no rembg (whatever the
    machine's models folder holds); started (pool ready) unless ``start`` is False."""
    from app.segment.rembg_auto import RembgChoice

    ctx = AppContext(settings, Path(tmp_path) / "gradio", supervisor_factory=(lambda: sup) if sup else None,
                     segmenter_loader=lambda: SegmenterChoice(GrabCutSegmenter(), "GrabCut", "test"),
                     rembg_loader=lambda: RembgChoice(None))
    if start:
        ctx.start(wait=True)
    return ctx


def wired_outputs(demo) -> dict:
    """handler -> the outputs of every event the wiring runs it for (a list of lists)."""
    out: dict = {}
    for block_fn in demo.fns.values():
        fn = block_fn.fn
        handler = getattr(fn, "handler", None) or getattr(fn, "func", None)
        if handler is not None:
            out.setdefault(handler, []).append(list(block_fn.outputs))
    return out


def named(updates: dict, page) -> dict:
    """{Page field name: value} of a handler's answer, for readable assertions."""
    names = {id(getattr(page, f)): f for f in page.__dataclass_fields__ if f not in ("demo", "examples")}
    return {names[id(c)]: v for c, v in updates.items()}


def request(token: str | None, tab: str, host: str = "127.0.0.1"):
    """What a Gradio request carries that the server reads: the browser cookie, the tab's
    session hash, the client's address."""
    cookies = {browser.BROWSER_COOKIE: token} if token else {}
    return SimpleNamespace(cookies=cookies, session_hash=tab, client=SimpleNamespace(host=host))


def wired_page(folder: Path, settings=None) -> SimpleNamespace:
    """A page built from ``settings`` (the defaults when None) and wired, with the outputs the
    wiring declares: (page, outputs). For a module's tests to share: building one takes
    0.5-1 s of Gradio's time, and the handler tests call the handlers themselves, with a
    page and a context of their own (``handler(page, ctx, who, ...)``), reading the wiring
    only for what it declares. The wiring's own calls, bound to the context made here (not
    started: no pool, no segmenter), are never run."""
    from kiln.settings import Settings
    from app.web.page.layout import layout
    from app.web.page.wiring import wire

    settings = Settings() if settings is None else settings
    page = layout(settings)
    wire(page, make_context(folder, settings, start=False))
    return SimpleNamespace(page=page, outputs=wired_outputs(page.demo))
