"""How a tab's job ended, as the page shows it: an ``Outcome`` (the job's last status, its
published files, the browser's history then), kept in the active-jobs record
(``app.web.state.tab_jobs.ActiveJobs.keep_outcome``) until the page shows it.

Why it is kept and not shown at once: Gradio 6.31's Model3D never mounts its viewer when a
generator sets its value, so the generator that follows a job streams only the progress bar
and a plain handler run after it shows the outcome (``app.web.photo.generate_handlers.show_outcome``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from kiln.formats import extra_keys

from app.web.state import history
from app.web.state import browser_jobs as jobs
from app.web.server import usertext
from app.web.page import status_line as statusview

if TYPE_CHECKING:
    from worker.jobs.jobstore import JobStatus

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HistoryView:
    """The browser's history as the page shows it: the list (HTML) and the result files
    (published paths, newest first; None when there are none)."""

    html: str
    files: Optional[tuple[str, ...]] = None

    def file_list(self) -> Optional[list[str]]:
        """The files as a ``gr.File(file_count="multiple")`` takes them."""
        return list(self.files) if self.files else None


@dataclass(frozen=True)
class Outcome:
    """How a tab's Generate (or the job a loaded page followed) ended.

    ``status``: the job's last status (``worker.jobs.jobstore.JobStatus``); None when the press
    never became a job, and ``note`` says why. For a done job, ``glb`` / ``ply`` are the
    published files (``app.web.server.results``); ``note`` says why they are missing when publishing
    failed. ``extra``: the other formats' published files (OBJ zip, STL, PLY mesh), in
    ``kiln.formats.extra_keys``' order (a scene's: one per object, after). ``waited_s``: how long the press waited for a worker
    slot before the job was submitted ("Done in" counts it). ``history``: the browser's history
    once it ended. ``kind``: the job's kind ("image" | "bake"), so each tab shows only its own."""

    status: Optional["JobStatus"] = None
    note: str = ""
    kind: str = "image"
    waited_s: float = 0.0
    glb: Optional[str] = None
    ply: Optional[str] = None
    extra: tuple[str, ...] = ()
    history: Optional[HistoryView] = None

    @property
    def job_id(self) -> Optional[str]:
        return self.status.id if self.status is not None else None

    @property
    def state(self) -> str:
        """The job's state ('done', 'failed', 'cancelled'), or 'not started'."""
        return self.status.state if self.status is not None else "not started"

    def progress_html(self, dom_id: str = "kiln-progress") -> str:
        return statusview.progress_html(self.status, note=self.note, waited_s=self.waited_s, dom_id=dom_id,
                                        warning=photo_warning(self.status))

    def extra_files(self) -> Optional[list[str]]:
        """The other formats' files as a ``gr.File(file_count="multiple")`` takes them."""
        return list(self.extra) or None

    def sizes_markdown(self) -> str:
        """Each published file and its size, one line ("" when there are none)."""
        # each once: a Generate of several objects lists the viewer's GLB among the others
        paths = list(dict.fromkeys(p for p in (self.glb, *self.extra, self.ply) if p))
        return files_markdown(paths)


def page_bytes(n: int) -> str:
    """A file's size as the page's download boxes (Gradio's file list) show it beside this
    line: units of 1024 called KB and MB, one decimal (801.8 KB), so one file never reads as
    821.0 kB here and 801.8 KB there."""
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def files_markdown(paths) -> str:
    """'**Files:** `horse-1.glb` 1.2 MB · `horse-1.stl` 0.4 MB' for the files at ``paths``."""
    shown = []
    for p in paths:
        try:
            shown.append(f"`{Path(p).name}` {page_bytes(Path(p).stat().st_size)}")
        except OSError:
            continue
    return ("**Files:** " + " · ".join(shown)) if shown else ""


NOT_PROJECTED = "the photo was not projected"


def photo_warning(st: Any) -> str:
    """What a done bake did not do that it was asked to: the photo not projected because the
    camera does not fit, with what to change (for the camera given, or the one fitted);
    "" otherwise."""
    pipeline = st.stats.pipeline if st is not None and st.state == "done" else None
    model = pipeline.model if pipeline is not None else None
    if pipeline is None or model is None or not any(w.startswith(NOT_PROJECTED) for w in pipeline.warnings):
        return ""
    if model.camera in ("file", "focal"):
        change = ("try the other camera frame (OpenGL or OpenCV), another focal length, or leave the "
                  "camera out so one is fitted to the mask")
    else:
        change = ("check that the mask covers the whole object and nothing else, or give the photo's "
                  "camera (a camera file or its focal length)")
    return f"the photo was not projected: the camera does not fit it. To use the photo, {change}"


def not_started(note: str, kind: str = "image") -> Outcome:
    """A Generate (or a Bake, ``kind`` "bake") that never became a job; ``note`` says why."""
    return Outcome(note=note, kind=kind)


def browser_history(ctx, session: str, statuses: Optional[list] = None) -> HistoryView:
    """The history of ``session``'s browser (all its tabs' jobs; ``statuses`` when the
    caller has read them already). Publishing each done job's files is what lets the
    browser download them again."""
    if ctx.sup is None:
        return HistoryView(history.history_html([]))
    statuses = jobs.browser_jobs(ctx, session) if statuses is None else statuses
    infos = jobs.job_infos(ctx, statuses)
    files = history.history_files(session, statuses, ctx.publisher, infos)
    return HistoryView(history.history_html(statuses, ctx.summaries, infos),
                       tuple(p for p, _ in files) or None)


def job_outcome(ctx, session: str, last: Any, waited_s: Optional[float] = None) -> Outcome:
    """The outcome of an ended job: a done job's files published for ``session``'s browser
    (named '<image>-<n>.glb', ``history.result_stems``) and the browser's history.
    ``waited_s`` None: the wait stored with the job (what the page that pressed it said)."""
    note, files = "", {}
    statuses = jobs.browser_jobs(ctx, session)
    if waited_s is None:
        info = jobs.job_infos(ctx, [last]).get(last.id)
        waited_s = info.waited_s if info is not None else 0.0
    # a job ended: what jobs take here lately (the status line, the estimates) is worked out again
    ctx.typical_job_s.clear()
    if last.state == "done":
        try:
            stems = history.result_stems(statuses, jobs.job_infos(ctx, statuses))
            files = ctx.publisher.publish(session, last, stems.get(last.id))
        except (OSError, usertext.UIError) as e:
            log.exception("publishing %s failed", last.id)
            note = f"the result could not be prepared for download: {usertext.public_text(str(e))}"
    return Outcome(status=last, note=note, waited_s=waited_s, kind=last.kind,
                   glb=str(files["glb"]) if "glb" in files else None,
                   ply=str(files["ply"]) if "ply" in files else None,
                   extra=tuple(str(files[k]) for k in extra_keys(files)),
                   history=browser_history(ctx, session, statuses))
