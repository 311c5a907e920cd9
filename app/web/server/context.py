"""Everything the UI's handlers share across sessions: settings, the worker pool,
the segmenter, published results. One ``AppContext`` per server process.

The supervisor (spawned workers + their capability probe) and the SAM2 model
both take seconds to come up, so they start on background threads: the page is
served at once, segmentation uses GrabCut until SAM2 is ready, and a Generate
pressed before the workers are up waits for them. rembg's model (for "Find the
object" and mask "auto"), when installed, loads on the segmenter's thread after it.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from kiln.records import Capabilities
from kiln.settings import Settings

from app.web.state.tab_jobs import ActiveJobs
from app.web.state.fitted_cameras import FittedCameras
from app.web.state.estimates import CostModel, JobShape
from app.web.server.browser_files import OwnedFiles
from app.web.server.results import ResultPublisher
from app.segment.rembg_auto import RembgChoice, RembgModel, choose_rembg
from app.segment.segment import GrabCutSegmenter, SegmenterChoice, choose_segmenter
from app.web.state.sessions import SessionLimits, SessionStore

if TYPE_CHECKING:
    from worker.pool.supervisor import Supervisor

# Full-size decodes at once (an upload, a job's submit): PIL's copy, its conversion and the
# array made from it took ~540 MB at the peak of one 40 MP decode (app.max_pixels), so they
# take turns; a 12 MP photo decodes in a fraction of a second.
DECODES_AT_ONCE = 1
# A result published to a page within this long counts as on show: the page's own copy stays
# viewable anyway (Gradio's folder, cleaned daily), the job's files stay for its downloads.
SHOWN_S = 3600.0

log = logging.getLogger(__name__)


def expected_workers(settings: Settings) -> int:
    """How many jobs can run at once: the configured worker count, else one per visible
    GPU (asked without touching CUDA), else one."""
    if settings.worker.count > 0:
        return settings.worker.count
    if settings.worker.device == "cpu":
        return 1
    from worker.child.env import detect_gpus

    return max(1, len(detect_gpus()))


class AppContext:
    def __init__(self, settings: Settings, files_dir: Path,
                 supervisor_factory: Optional[Callable[[], Supervisor]] = None,
                 segmenter_loader: Optional[Callable[[], SegmenterChoice]] = None,
                 rembg_loader: Optional[Callable[[], RembgChoice]] = None):
        """``files_dir``: Gradio's upload/cache folder (results are published there).
        ``supervisor_factory``: returns an un-started ``worker.pool.supervisor.Supervisor``;
        ``segmenter_loader``: returns a ``SegmenterChoice`` (default: SAM2 if it loads);
        ``rembg_loader``: returns a ``RembgChoice`` (default: rembg if its model is in the
        models folder and it loads)."""
        self.settings = settings
        self.files_dir = Path(files_dir)
        self.workers = expected_workers(settings)
        self.publisher = ResultPublisher(Path(files_dir) / "results")
        # uploads and canvas images, each served only to its browser
        self.owned = OwnedFiles(Path(files_dir) / "canvas")
        # per-tab state, keyed by the server's session name (cookie + tab), on disk
        self.sessions = SessionStore(Path(files_dir).parent / "sessions",
                                     SessionLimits.from_settings(settings.app))
        self.decodes = threading.BoundedSemaphore(DECODES_AT_ONCE)
        # per tab: its jobs not yet ended, a Generate waiting, its last job's Outcome
        self.active = ActiveJobs()
        # per tab: the camera its bake tab fitted, for its next Bake
        self.fits = FittedCameras()
        self.summaries: dict[str, str] = {}
        # job kind -> (monotonic time, seconds or None): what jobs took lately (jobs.typical_job_seconds)
        self.typical_job_s: dict[str, tuple[float, Optional[float]]] = {}
        # job kind -> (monotonic time, its cost model or None), job id -> its shape: a job's
        # estimate from its own settings (browser_jobs.job_estimate_s)
        self.cost_models: dict[str, tuple[float, Optional[CostModel]]] = {}
        self.job_shapes: dict[str, JobShape] = {}
        self._supervisor_factory = supervisor_factory or self._default_supervisor
        self._segmenter_loader = segmenter_loader
        self._rembg_loader = rembg_loader or choose_rembg
        self.sup: Optional[Supervisor] = None
        self.sup_error: Optional[str] = None
        self.sup_ready = threading.Event()
        self._seg = SegmenterChoice(GrabCutSegmenter(), "GrabCut", "SAM2 not checked yet")
        self._rembg: Optional[RembgModel] = None   # once loaded
        self.seg_ready = threading.Event()
        self._threads: list[threading.Thread] = []

    def _default_supervisor(self):
        from worker.pool.supervisor import Supervisor

        s = self.settings
        return Supervisor(s, jobs_dir=Path(s.app.jobs_dir), cache_dir=Path(s.app.cache_dir))

    # -- background start-up ---------------------------------------------------
    def start(self, wait: bool = False) -> "AppContext":
        self._spawn(self._start_supervisor, "kiln-supervisor-start")
        self._spawn(self._load_segmenter, "kiln-segmenter-load")
        if wait:
            self.sup_ready.wait()
            self.seg_ready.wait()
        return self

    def _spawn(self, fn, name):
        t = threading.Thread(target=fn, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def _start_supervisor(self) -> None:
        try:
            sup = self._supervisor_factory()
            upkeep = getattr(sup, "upkeep", None)   # a test's stand-in supervisor may have none
            if upkeep is not None:
                # the disk budgets spare what pages show, and count the tabs' photos and
                # Gradio's files with the job store
                upkeep.protected = self.on_show
                upkeep.also_count = [self.sessions.root, self.files_dir]
                # and remove the copies of results whose jobs' files went (issue 37)
                upkeep.after_pass.append(self.publisher.trim)
            sup.start()
            self.sup = sup
            log.info("workers ready: %s", sup.capabilities())
        except Exception as e:  # noqa: BLE001 - shown in the UI; the page keeps working for segmentation
            log.exception("worker pool failed to start")
            self.sup_error = f"worker pool failed to start: {type(e).__name__}: {e}"
        finally:
            self.sup_ready.set()

    def _load_segmenter(self) -> None:
        try:
            if self._segmenter_loader is not None:
                choice = self._segmenter_loader()
            else:
                from kiln.checkpoints import resolve_checkpoint

                if resolve_checkpoint(self.settings.app) is not None:
                    # loading takes seconds: the status line says why GrabCut answers meanwhile
                    self._seg = SegmenterChoice(GrabCutSegmenter(), "GrabCut", "SAM2 loading…")
                choice = choose_segmenter(self.settings.app)
            self._seg = choice
            log.info("segmentation: %s%s", choice.description, f" ({choice.reason})" if choice.reason else "")
            if self.settings.app.auto_mask in ("auto", "rembg"):
                got = self._rembg_loader()
                self._rembg = got.model
                if got.model is not None or got.reason:
                    log.info("finding objects without clicks: %s", got.model.label if got.model is not None
                             else f"without rembg ({got.reason})")
        finally:
            self.seg_ready.set()

    def on_show(self) -> set[str]:
        """Job ids a page shows now or is about to (``worker.upkeep.budget`` never removes them)."""
        return self.active.on_show() | self.publisher.shown_within(SHOWN_S)

    # -- accessors -------------------------------------------------------------
    @property
    def segmenter(self):
        return self._seg.segmenter

    @property
    def finder(self):
        """What "Find the object" and mask "auto" use (``app.segment.automask.Finder``)."""
        from app.segment.automask import Finder

        return Finder(self.segmenter, self._rembg, self.settings.app.auto_mask)

    @property
    def segmenter_text(self) -> str:
        c = self._seg
        return f"{c.description} — {c.reason}" if c.reason else c.description

    def capabilities(self) -> Optional[Capabilities]:
        if self.sup is None:
            return None
        try:
            return self.sup.capabilities()
        except Exception:  # noqa: BLE001 - status line only
            return None

    def shutdown(self) -> None:
        if self.sup is not None:
            try:
                self.sup.shutdown()
            except Exception:  # noqa: BLE001
                log.exception("supervisor shutdown failed")
