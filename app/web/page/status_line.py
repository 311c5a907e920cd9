"""What the page says about work in progress: a job's progress bar and the status line."""

from __future__ import annotations

import heapq
import html
from typing import Any, Optional, Sequence

from kiln.records import Capabilities

from app.web.server.usertext import public_text

STAGE_LABELS = {"read": "Reading the files", "reconstruct": "Reconstructing", "render_views": "Rendering views",
                "mesh": "Simplifying mesh", "uv": "Unwrapping UVs", "bake": "Baking texture",
                "export": "Exporting GLB", "fit": "Fitting the camera", "place": "Placing the objects",
                "occlusion": "Depth test across the objects", "objects": "Baking each object",
                "join": "Joining the objects"}


# a model from a photo with fewer faces than this has lost its shape to simplification
# (simplify 0.999 made a 70-face card): the done line says so
FEW_FACES = 1000


def stage_label(stage: Optional[str]) -> str:
    """A stage name as the progress bar shows it; 'Starting' before the first stage."""
    if not stage:
        return "Starting"
    return STAGE_LABELS.get(stage, stage.replace("_", " ").capitalize())


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, ..., 11th, 12th, 13th, ..., 21st."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def about(seconds: float) -> str:
    """'about 20 s', 'about 2 min': an estimate in the unit a person reads."""
    if seconds < 90:
        return f"about {max(1, round(seconds))} s"
    return f"about {round(seconds / 60)} min"


def queue_wait_s(place: int, workers: int, typical_s: float, running_left: Optional[Sequence[float]] = None) -> float:
    """Seconds until a worker is free for the job ``place``-th in line (1: next).
    ``running_left``: what each job on a worker now has left (what jobs took lately less its
    time so far, 0 once it is past that); a worker without a job counts as free now. None:
    nothing known of them, so each of the ``workers`` is taken to have just started a job.
    Every job ahead in line takes ``typical_s`` on whichever worker is free first."""
    left = [typical_s] * max(1, workers) if running_left is None else [max(0.0, t) for t in running_left]
    free = sorted(left + [0.0] * max(0, workers - len(left))) or [0.0]
    for _ in range(max(0, place - 1)):
        heapq.heapreplace(free, free[0] + typical_s)   # sorted is a heap: the next job takes the first free
    return free[0]


def _queued_text(place: int, workers: int, typical_s: Optional[float],
                 running_left: Optional[Sequence[float]]) -> str:
    text = f"Waiting for a free worker: {ordinal(place)} in line"
    if not typical_s:
        return text
    wait = queue_wait_s(place, workers, typical_s, running_left)
    if wait >= 1:
        return text + f", {about(wait)}"
    overdue = sum(1 for t in running_left or () if t <= 0)
    if overdue:
        # what it waits for has run longer than jobs here usually take: no figure is honest
        return text + (", when a running job ends (it is taking longer than usual)" if overdue == 1 else
                       ", when a running job ends (they are taking longer than usual)")
    return text + ", any moment"


def progress_html(st: Any = None, note: str = "", waited_s: float = 0.0, dom_id: str = "kiln-progress",
                  place: Optional[int] = None, workers: int = 1, typical_s: Optional[float] = None,
                  now: Optional[float] = None, note_state: str = "idle",
                  running_left: Optional[Sequence[float]] = None, warning: str = "") -> str:
    """A progress bar for a job status (``worker.jobs.jobstore.JobStatus``) or a note.
    ``waited_s``: how long the press waited before the job was submitted; "Done in" counts
    it (the person waited for it too). For a job in progress: ``place`` in the queue
    (1: next) of a waiting one, ``workers`` serving it, ``typical_s`` what a job has taken
    lately (None: nothing to go by), ``running_left`` what the jobs running now have left
    (``queue_wait_s``), ``now`` (Unix time) for a running job's elapsed time; with them the
    bar says "2nd in line, about 20 s" / "8 s so far, about 4 s left".

    ``warning``: what a done job did not do that it was asked to (a bake whose photo was not
    projected), with what to change: the bar is amber, not green, and says it after "Done";
    the outer element carries data-warning="1".

    The outer element (id ``dom_id``: one per tab) carries data-state / data-stage so
    scripts and tests can read it.
    """
    if st is None:   # a note alone: data-state ``note_state`` ("idle"; "refused" for a refusal)
        body = html.escape(public_text(note)) if note else "No job yet."
        return (f'<div id="{dom_id}" data-state="{html.escape(note_state)}">'
                f'<div class="kiln-note kiln-{html.escape(note_state)}">{body}</div></div>')
    pct = max(0.0, min(1.0, float(st.progress or 0.0))) * 100
    state = st.state
    if state == "queued":
        if place is not None:
            text = _queued_text(place, workers, typical_s, running_left)
            if st.attempts:   # a retry after a crash: the supervisor's message says why
                text += f" ({st.message})" if st.message else ""
        else:
            text = note or st.message or "queued"
            text = text[:1].upper() + text[1:]
    elif state == "running":
        text = f"{stage_label(st.stage)} — {pct:.0f}%"
        if now is not None and st.started:
            elapsed = max(0.0, now - st.started)
            text += f" — {elapsed:.0f} s so far"
            if typical_s and typical_s > elapsed:
                text += f", {about(typical_s - elapsed)} left"
        # the worker prefixes its messages with the stage name, which the label already says
        detail = (st.message or "").removeprefix(f"{st.stage}: ") if st.stage else st.message
        if detail:
            text += f" — {detail}"
        if note:   # which of several jobs one press made ("object 2 of 3")
            text = f"{note[:1].upper()}{note[1:]}: {text}"
    elif state == "done":
        pct = 100.0
        timings = st.timings or {}
        total = timings.get("total_s")
        if isinstance(total, (int, float)):
            # where the time went before the work: the page handing the press to the server
            # (two events through Gradio's queue, the full-size image read again), then the
            # job's wait in the supervisor's queue for a free worker
            handover, queued = max(0.0, waited_s), float(timings.get("queued_s") or 0.0)
            text = f"Done in {total + handover:.1f} s"
            before = [f"{t:.1f} s {what}" for t, what in ((handover, "handing it to the server"),
                                                           (queued, "waiting for a worker")) if t >= 0.5]
            if before:
                text += f" (of which {', '.join(before)})"
        else:
            text = "Done"
        stats = st.stats.pipeline
        reused = [what for what, cached in (("reconstruction", stats and stats.reconstruction_cached),
                                            ("views", stats and stats.views_cached)) if cached]
        if reused:
            text += f" ({' and '.join(reused)} reused from cache)"
        if stats is not None and stats.texture_size_auto:
            text += f"; texture {stats.texture_size_auto} px (auto)"
        if stats is not None and 0 < stats.faces < FEW_FACES and stats.model is None:
            text += (f"; only {stats.faces:,} faces: a lower simplify ratio keeps more of the shape")
        if note:
            text += f"; {note}"
        if warning:
            text += f". But {warning}"
    elif state == "cancelled":
        # the supervisor says why: "cancelled by user", "cancelled before it started", …
        why = (st.error or "").strip() or "cancelled"
        text = why[:1].upper() + why[1:] if why.lower().startswith("cancel") else f"Cancelled: {why}"
    else:
        text = "Failed: " + (st.error or st.message or "unknown reason")
    warned = bool(warning) and state == "done"
    fill = "warning" if warned else state
    flag = ' data-warning="1"' if warned else ""
    return (f'<div id="{dom_id}" data-state="{html.escape(state)}" '
            f'data-stage="{html.escape(st.stage or "")}" data-job="{html.escape(st.id)}"{flag}>'
            f'<div class="kiln-bar"><div class="kiln-fill kiln-{html.escape(fill)}" '
            f'style="width:{pct:.1f}%"></div></div>'
            f'<div class="kiln-note">{html.escape(public_text(text))}</div></div>')


def status_line(caps: Optional[Capabilities], segmenter_text: str, running: int, waiting: int,
                workers_note: str = "", typical_s: Optional[float] = None) -> str:
    """The status line: one sentence in plain words (what to expect, what to do), with the
    technical detail (device, backends, queue, segmenter and why) in a fold one click away.
    ``typical_s``: what a model from a photo took on this server lately (None: none yet),
    said instead of a guess."""
    if not caps:
        dev = workers_note or "workers starting…"
        backends = "…"
        plain = [workers_note[:1].upper() + workers_note[1:] if workers_note else "Workers starting…"]
    else:
        dev = "CPU" if caps.device == "cpu" else caps.device
        names = [n for n in ("gsplat", "nvdiffrast", "moderngl") if caps.works(n)]
        backends = ", ".join(names + ["cpu renderer"])
        took = (f"a model took {about(typical_s)} here lately" if typical_s is not None
                else "no model timed on this server yet")
        plain = [f"CPU only: {took}" if dev == "CPU" else f"GPU ready ({dev}): {took}"]
    if segmenter_text.startswith("SAM2"):
        plain.append("selection by SAM2: a click, a box or \"Find the object\" usually selects the whole object")
    elif "loading" in segmenter_text:
        plain.append("SAM2 is loading, GrabCut selects meanwhile: drag a box around the object or press "
                     "\"Find the object\"")
    elif "SAM2" in segmenter_text:
        plain.append("SAM2 not available, using GrabCut: drag a box around the object (or press "
                     "\"Find the object\"), then click more points")
    else:
        plain.append("selection by GrabCut: drag a box around the object (or press \"Find the object\"), "
                     "then click more points")
    if running or waiting:
        plain.append(f"{running} job{'s' if running != 1 else ''} running, {waiting} waiting")
    detail = (f"**Device:** {html.escape(str(dev))} · **Backends:** {html.escape(backends)} · "
              f"**Jobs:** {running} running, {waiting} waiting · "
              f"**Segmentation:** {html.escape(segmenter_text)}")
    return (f'<span class="kiln-plain">{html.escape("; ".join(plain))}.</span>\n'
            f'<details class="kiln-details"><summary>Details</summary>\n\n{detail}\n\n</details>')


