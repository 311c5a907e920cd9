"""A browser's job history as the page shows it: image name, thumbnail, state and why, the
name its GLB downloads as; what the page keeps of a job beside it (``JobInfo``)."""

from __future__ import annotations

import html
import json
import re
import threading
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from app.web.server.browser import same_browser
from app.web.server.usertext import public_text
from app.web.server.results import ResultPublisher
from app.web.state.uploads import downscale

NO_HISTORY = "No results yet in this browser."
# said above a history with a result to show
PICK_HINT = "Click a result to show it in the viewer with its downloads."


@dataclass(frozen=True)
class JobInfo:
    """What the page knows of a job besides its status: the image's name, a thumbnail (a
    data: URI of a small JPEG), the settings in words, how long the press waited for a
    worker before the job was submitted, and why the page cancelled it (if it did).
    Kept with the job (``INFO_FILE`` in its directory), so history outlives the server."""

    image_name: str
    thumbnail: str = ""
    summary: str = ""
    waited_s: float = 0.0
    cancel_reason: str = ""
    # the jobs one Generate made, one per object of the photo (the built-in reconstruction makes
    # each object its own model: ``app.web.photo.objects``), this one among them; () for one
    objects: tuple[str, ...] = ()

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Optional["JobInfo"]:
        try:
            data = json.loads(text)
            known = {f.name for f in fields(cls)}
            values = {k: v for k, v in data.items() if k in known}
            if "objects" in values:
                values["objects"] = tuple(str(j) for j in values["objects"] or ())
            return cls(**values)
        except (ValueError, TypeError):
            return None


# The page's file in a job's directory, beside the job store's own files (worker.jobs.jobstore).
INFO_FILE = "page.json"
# job dir -> info: the file changes only by save_info. The most recently used ``INFO_CACHE_MAX``
# only: a server that runs for a month sees far more jobs than any page lists (issue 37), and
# an entry that went is read again from its file
INFO_CACHE_MAX = 2048
_INFO_CACHE: OrderedDict[str, JobInfo] = OrderedDict()
_INFO_LOCK = threading.Lock()


def _remember(path: Path, info: JobInfo) -> None:
    with _INFO_LOCK:
        _INFO_CACHE[str(path)] = info
        _INFO_CACHE.move_to_end(str(path))
        while len(_INFO_CACHE) > INFO_CACHE_MAX:
            _INFO_CACHE.popitem(last=False)


def save_info(job_dir: Path, info: JobInfo) -> None:
    from kiln.atomic import atomic_write

    path = Path(job_dir) / INFO_FILE
    atomic_write(path, info.to_json().encode())
    _remember(path, info)


def load_info(job_dir: Path) -> Optional[JobInfo]:
    """The job's ``JobInfo``, or None when the page never wrote one (a CLI job)."""
    path = Path(job_dir) / INFO_FILE
    with _INFO_LOCK:
        info = _INFO_CACHE.get(str(path))
    if info is None:
        try:
            info = JobInfo.from_json(path.read_text())
        except OSError:
            return None
    if info is not None:
        _remember(path, info)
    return info


def thumbnail_uri(rgb: np.ndarray, side: int = 72) -> str:
    """A data: URI of a JPEG of (h, w, 3) uint8 ``rgb`` with its longest side ``side``."""
    import base64

    import cv2

    small = downscale(rgb, side)
    ok, buf = cv2.imencode(".jpg", np.ascontiguousarray(small[:, :, ::-1]), [cv2.IMWRITE_JPEG_QUALITY, 80])
    return "data:image/jpeg;base64," + base64.b64encode(buf.tobytes()).decode() if ok else ""


_STEM_BAD_RE = re.compile(r"[^A-Za-z0-9._-]+")


def makes_model(st: Any) -> bool:
    """Whether a job makes a model (an image or a bake job); a fit job (the bake tab's camera
    fitted before baking) makes none, and the history leaves it out: its tab shows it."""
    return getattr(st, "kind", "image") != "fit"


def result_stems(statuses: Sequence[Any], infos: dict) -> dict[str, str]:
    """job id -> '<image-name>-<n>' for done jobs: n counts the done results of that image
    among ``statuses`` (a browser's jobs), oldest first, so names stay put as more come.
    A job whose image the page does not know (a CLI job) counts as 'model'."""
    out: dict[str, str] = {}
    seen: dict[str, int] = {}    # stem -> done results so far
    for st in sorted(statuses, key=lambda s: (s.created, s.id)):
        if st.state != "done" or not makes_model(st):
            continue
        info = infos.get(st.id)
        name = info.image_name if info is not None else "model"
        stem = (_STEM_BAD_RE.sub("_", Path(name).stem).strip("._-") or "model")[:60]
        seen[stem] = seen.get(stem, 0) + 1
        out[st.id] = f"{stem}-{seen[stem]}"
    return out


def _why(st: Any, info: Optional[JobInfo] = None) -> str:
    reason = public_text(st.error or st.message or "")
    if st.state == "cancelled":
        if info is not None and info.cancel_reason:
            return public_text(info.cancel_reason)
        return reason or "cancelled"
    return f"failed: {reason or 'unknown reason'}"


def removed_text(st: Any) -> str:
    """What a job whose files the disk budget removed says in the history: when and why
    ('' for a job whose files are there)."""
    when = getattr(st, "removed", None)
    if when is None:
        return ""
    day = time.strftime("%Y-%m-%d %H:%M", time.localtime(when))
    why = getattr(st, "removed_why", "") or "the disk budget"
    return f"{st.state}; its files were removed on {day}: {why}"


def history_html(statuses: Sequence[Any], summaries: Optional[dict] = None,
                 infos: Optional[dict] = None) -> str:
    """The browser's jobs, newest first, as HTML: thumbnail, image name, time, job id, state
    (a cancelled or failed job says why), settings, and the name its GLB downloads as.
    ``summaries``: job id -> settings text (else the ``JobInfo``'s); ``infos``: job id ->
    ``JobInfo``."""
    statuses = [st for st in statuses if makes_model(st)]
    if not statuses:
        return f'<div class="kiln-history-empty">{NO_HISTORY}</div>'
    infos = infos or {}
    stems = result_stems(statuses, infos)
    rows = []
    for st in sorted(statuses, key=lambda s: (s.created, s.id), reverse=True):
        info = infos.get(st.id)
        when = time.strftime("%H:%M:%S", time.localtime(st.created)) if st.created else "--:--:--"
        state = st.state if st.state in ("done", "queued", "running") else _why(st, info)
        gone = removed_text(st)
        if gone:
            state = gone if st.state == "done" else f"{state}; {gone.split('; ', 1)[1]}"
        elif st.state == "done":
            total = (st.timings or {}).get("total_s")
            if isinstance(total, (int, float)):
                state += f" in {total + (info.waited_s if info is not None else 0.0):.1f} s"
        thumb = (f'<img class="kiln-thumb" alt="" src="{html.escape(info.thumbnail)}">'
                 if info is not None and info.thumbnail else '<span class="kiln-thumb"></span>')
        name = html.escape(info.image_name) if info is not None else "(image not known)"
        summary = (summaries or {}).get(st.id) or (info.summary if info is not None else "")
        file_note = f" · <code>{html.escape(stems[st.id])}.glb</code>" if st.id in stems and not gone else ""
        removed_class = " kiln-removed" if gone else ""
        # a done row shows its model when clicked (page/assets.HISTORY_JS), unless its files were
        # removed; the job id, for support and scripts, goes last, in the row's small print
        pick = (' data-pick="1" role="button" tabindex="0" title="Show this model in the viewer"'
                if st.id in stems and not gone else "")
        rows.append(f'<li class="kiln-job kiln-{html.escape(st.state)}{removed_class}" data-job="{html.escape(st.id)}"{pick}>'
                    f'{thumb}<div><b>{name}</b> · {when}<br>'
                    f'{html.escape(state)}{" · " + html.escape(summary) if summary else ""}{file_note}'
                    f'<br><small class="kiln-job-id">job {html.escape(st.id)}</small></div></li>')
    hint = f'<div class="kiln-history-hint">{PICK_HINT}</div>' if stems else ""
    return hint + '<ul class="kiln-history-list">' + "".join(rows) + "</ul>"


def history_files(session: str, statuses: Sequence[Any], publisher: ResultPublisher,
                  infos: Optional[dict] = None) -> list[tuple[str, str]]:
    """(path, download name) of every downloadable output of the done jobs among
    ``statuses`` that ``session``'s browser made, newest first; published as
    '<image-name>-<n>.<ext>' (``result_stems``), which is the name a browser saves."""
    stems = result_stems(statuses, infos or {})
    files: list[tuple[str, str]] = []
    for st in sorted(statuses, key=lambda s: (s.created, s.id), reverse=True):
        # a job whose files the disk budget removed offers no download (its entry says why)
        if st.state == "done" and getattr(st, "removed", None) is None and same_browser(session, st.session):
            files += [(str(p), p.name) for _, p in sorted(publisher.publish(session, st, stems.get(st.id)).items())]
    return files
