"""A session's job history as the page shows it: image name, thumbnail, state and why, the
name its GLB downloads as."""

from __future__ import annotations

import html
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from .messages import md_text, public_text
from .results import ResultPublisher
from .uploads import downscale

NO_HISTORY = "No results yet in this session."


@dataclass(frozen=True)
class JobInfo:
    """What the page remembers of a job it submitted: the image's name and a thumbnail
    (a data: URI of a small JPEG)."""

    image_name: str
    thumbnail: str = ""


def thumbnail_uri(rgb: np.ndarray, side: int = 72) -> str:
    """A data: URI of a JPEG of (h, w, 3) uint8 ``rgb`` with its longest side ``side``."""
    import base64

    import cv2

    small = downscale(rgb, side)
    ok, buf = cv2.imencode(".jpg", np.ascontiguousarray(small[:, :, ::-1]), [cv2.IMWRITE_JPEG_QUALITY, 80])
    return "data:image/jpeg;base64," + base64.b64encode(buf.tobytes()).decode() if ok else ""


_STEM_BAD_RE = re.compile(r"[^A-Za-z0-9._-]+")


def result_stems(statuses: Sequence[Any], infos: dict) -> dict[str, str]:
    """job id -> '<image-name>-<n>' for done jobs whose image the page knows: n counts the
    session's done results of that image, oldest first, so names stay put as more come."""
    out, seen = {}, {}
    for st in sorted(statuses, key=lambda s: (s.created, s.id)):
        info = infos.get(st.id)
        if st.state != "done" or info is None:
            continue
        stem = _STEM_BAD_RE.sub("_", Path(info.image_name).stem).strip("._") or "model"
        seen[stem] = seen.get(stem, 0) + 1
        out[st.id] = f"{stem[:60]}-{seen[stem]}"
    return out


def download_name(stem: Optional[str], path: Path) -> str:
    """The name a browser saves a published result as: '<image-name>-<n>.glb', else its own."""
    return f"{stem}{path.suffix}" if stem else path.name


def _why(st: Any) -> str:
    reason = public_text(st.error or st.message or "")
    if st.state == "cancelled":
        return reason or "cancelled"
    return f"failed: {reason or 'unknown reason'}"


def history_html(statuses: Sequence[Any], summaries: Optional[dict] = None,
                 infos: Optional[dict] = None) -> str:
    """The session's jobs, newest first, as HTML: thumbnail, image name, time, job id, state
    (a cancelled or failed job says why), settings, and the name its GLB downloads as.
    ``summaries``: job id -> settings text; ``infos``: job id -> ``JobInfo``."""
    if not statuses:
        return f'<div class="kiln-history-empty">{NO_HISTORY}</div>'
    infos = infos or {}
    stems = result_stems(statuses, infos)
    rows = []
    for st in sorted(statuses, key=lambda s: (s.created, s.id), reverse=True):
        info = infos.get(st.id)
        when = time.strftime("%H:%M:%S", time.localtime(st.created)) if st.created else "--:--:--"
        state = st.state if st.state in ("done", "queued", "running") else _why(st)
        if st.state == "done":
            total = (st.timings or {}).get("total_s")
            state += f" in {total:.1f} s" if isinstance(total, (int, float)) else ""
        thumb = (f'<img class="kiln-thumb" alt="" src="{html.escape(info.thumbnail)}">'
                 if info is not None and info.thumbnail else '<span class="kiln-thumb"></span>')
        name = html.escape(info.image_name) if info is not None else "(image not known)"
        summary = (summaries or {}).get(st.id, "")
        file_note = f" · <code>{html.escape(stems[st.id])}.glb</code>" if st.id in stems else ""
        rows.append(f'<li class="kiln-job kiln-{html.escape(st.state)}" data-job="{html.escape(st.id)}">'
                    f'{thumb}<div><b>{name}</b> · {when} · <code>{html.escape(st.id)}</code><br>'
                    f'{html.escape(state)}{" · " + html.escape(summary) if summary else ""}{file_note}'
                    f'</div></li>')
    return '<ul class="kiln-history-list">' + "".join(rows) + "</ul>"


def history_markdown(statuses: Sequence[Any], summaries: Optional[dict] = None) -> str:
    """A Markdown list of a session's jobs, newest first; ``summaries``: job id -> settings text.
    (A list, not a table: in the narrow column a table wrapped its words mid-way.)"""
    if not statuses:
        return NO_HISTORY
    rows = []
    for st in sorted(statuses, key=lambda s: (s.created, s.id), reverse=True):
        when = time.strftime("%H:%M:%S", time.localtime(st.created)) if st.created else "--:--:--"
        state = st.state if st.state in ("done", "queued", "running") else _why(st)
        summary = (summaries or {}).get(st.id, "")
        rows.append(f"- **{when}** `{st.id}` — {md_text(state)}" + (f" — {md_text(summary)}" if summary else ""))
    return "\n".join(rows)


def history_files(session: str, statuses: Sequence[Any], publisher: ResultPublisher,
                  infos: Optional[dict] = None) -> list[tuple[str, str]]:
    """(path, download name) of every downloadable output of the session's done jobs, newest first."""
    stems = result_stems(statuses, infos or {})
    files: list[tuple[str, str]] = []
    for st in sorted(statuses, key=lambda s: (s.created, s.id), reverse=True):
        if st.state == "done" and st.session == session:
            files += [(str(p), download_name(stems.get(st.id), p))
                      for _, p in sorted(publisher.publish(session, st).items())]
    return files

