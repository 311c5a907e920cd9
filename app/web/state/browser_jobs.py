"""A browser's jobs: submit once the worker pool is up, follow (from the page that pressed
Generate or from any page of the same browser loaded later), cancel on request, and cancel
a job no page has followed for ``app.orphan_grace_s``. Every call the page makes to the
supervisor is in this module.

Why a job outlives the page that started it: a reload (or a second tab) is a new Gradio
session, and the person expects to find their job there. Why it does not outlive every
page for long: a job nobody watches holds a worker others wait for. A follower pulls the
job's status at least every ``BEAT_S`` while Gradio keeps asking for the next update, and
each pull counts as the job being followed; once Gradio stops (the page went away) the
pulls stop, and the reaper cancels the job ``app.orphan_grace_s`` later unless a page of
its browser picked it up again.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import replace
from typing import Any, Generator, Iterator, Optional

import numpy as np

from kiln.settings import Settings

from app.web.page import status_line as statusview
from app.web.server.browser import browser_of, same_browser
from app.web.state.estimates import CostModel, JobShape, sample_of, shape_of
from app.web.state.history import JobInfo, load_info, save_info
from app.web.server.usertext import public_text

log = logging.getLogger(__name__)

WAITING_FOR_POOL = "Waiting for the worker pool to start…"
# a follower yields at least this often, even when nothing changed, so that Gradio gets the
# chance to drop a closed page's generator (it only looks between two updates)
BEAT_S = 1.0


def watch_job(job, poll_s: float = 0.25, beat_s: Optional[float] = None,
              on_poll=None) -> Iterator[Any]:
    """Yield the status of ``job`` (a ``worker.pool.jobhandle.Job``) whenever its sequence
    number changes, ending with a terminal status (done / failed / cancelled). With
    ``beat_s``, also yield the unchanged status when that long passed without a yield.
    ``on_poll()`` runs at every poll."""
    seen, last_yield = -1, time.monotonic()
    while True:
        st = job.status()
        if on_poll is not None:
            on_poll()
        now = time.monotonic()
        if st.seq != seen or st.terminal or (beat_s is not None and now - last_yield >= beat_s):
            seen, last_yield = st.seq, now
            yield st
        if st.terminal:
            return
        time.sleep(poll_s)


def follow_job(ctx, session: str, rgb: np.ndarray, mask: np.ndarray, settings: Settings,
               info: Optional[JobInfo] = None, pressed_at: Optional[float] = None,
               poll_s: float = 0.25, more_masks: tuple = ()) -> Iterator[tuple[str, Any]]:
    """Submit a job for ``session`` once the worker pool is up, then follow it.

    ``ctx``: an ``app.web.server.context.AppContext``; rgb (H, W, 3) uint8, mask (H, W) bool;
    ``more_masks``: the photo's other objects, for one scene job (a reconstruction that
    places objects: ``worker.pool.supervisor.Supervisor.submit``);
    ``info``: what the page keeps with the job (image name, thumbnail; the settings
    summary is added here, and the time from ``pressed_at``, when Generate was pressed,
    to the submit: "Done in" counts it). Yields ``(note, None)`` while the pool starts or when the job
    cannot be submitted (the note says why), then ``("", JobStatus)`` whenever the job
    changes (and every ``BEAT_S`` unchanged), ending with its terminal status.

    Closing the generator early (the page went away) leaves the job running for the
    browser's next page (``follow_existing``); it is cancelled when the tab pressed
    Cancel (``app.web.state.tab_jobs.ActiveJobs.request_cancel``), or by the reaper once no page followed it for
    ``app.orphan_grace_s``.
    """
    def submit(sup):
        nonlocal rgb, mask, more_masks
        try:
            if more_masks:   # a scene of several objects: one job
                return sup.submit(rgb, mask, settings, session=session, more_masks=tuple(more_masks))
            return sup.submit(rgb, mask, settings, session=session)
        finally:
            del rgb, mask, more_masks   # full size, up to app.max_pixels: the job store has them now

    yield from _submit_and_follow(ctx, session, submit, settings, info, pressed_at, poll_s)


def follow_each(ctx, session: str, rgb: np.ndarray, masks: list, settings: Settings,
                info: Optional[JobInfo] = None, pressed_at: Optional[float] = None,
                poll_s: float = 0.25) -> Iterator[tuple[str, Any]]:
    """One job per object of one photo (``masks``: (H, W) bool each), all submitted at once and
    followed in turn, as ``follow_job`` follows one: ``(note, status)`` with the note saying which
    object, ending with the last one's terminal status. Each job's ``JobInfo.objects`` lists them
    all, so its outcome (here or on a reloaded page) shows every object's model. Every poll
    counts as following each of them, so the reaper leaves the waiting ones alone."""
    sup = yield from _worker_pool(ctx)
    if sup is None:
        return
    handles: list = []
    try:
        for mask in masks:
            handles.append(sup.submit(rgb, mask, settings, session=session))
    except Exception as e:  # noqa: BLE001 - queue full or a refused input: the person reads why
        log.warning("submit failed: %s", e)
        for job in handles:   # all or none: half a Generate is not what was asked for
            _cancel(job, "another object of the same Generate could not be submitted")
        yield f"Could not start the jobs: {public_text(str(e))}", None
        return
    finally:
        del rgb, masks
    summary = settings_summary(settings)
    ids = tuple(job.id for job in handles)
    waited = max(0.0, time.time() - pressed_at) if pressed_at is not None else 0.0
    for n, job in enumerate(handles, start=1):
        ctx.summaries[job.id] = f"object {n} of {len(handles)}; {summary}"
        if info is not None:
            _save_info(job, replace(info, summary=ctx.summaries[job.id], waited_s=waited, objects=ids))
        ctx.active.add(session, job.id)
    _ensure_reaper(ctx)
    if ctx.active.cancel_wanted(session):
        for job in handles:
            _cancel(job)

    def touch_all() -> None:
        for i in ids:
            ctx.active.touch(i)

    for n, job in enumerate(handles, start=1):
        last = None
        try:
            for last in watch_job(job, poll_s, BEAT_S, on_poll=touch_all):
                yield f"object {n} of {len(handles)}", last
        finally:
            if last is not None and last.terminal:
                ctx.active.finished(job.id)
            elif ctx.active.cancel_wanted(session):
                for other in handles[n - 1:]:
                    _cancel(other)


def follow_bake(ctx, session: str, bake, settings: Settings, info: Optional[JobInfo] = None,
                pressed_at: Optional[float] = None, poll_s: float = 0.25) -> Iterator[tuple[str, Any]]:
    """``follow_job`` for a bake job: ``bake`` is a ``worker.jobs.bakeinputs.CheckedBake``."""
    yield from _submit_and_follow(ctx, session, lambda sup: sup.submit_bake(bake, settings, session=session),
                                  settings, info, pressed_at, poll_s, summary=bake_summary(bake.request, settings))


def follow_fit(ctx, session: str, fit, settings: Settings, info: Optional[JobInfo] = None,
               pressed_at: Optional[float] = None, poll_s: float = 0.25) -> Iterator[tuple[str, Any]]:
    """``follow_job`` for a fit job (the photo's camera alone): ``fit`` is a
    ``worker.jobs.bakeinputs.CheckedBake`` from ``check_fit``."""
    yield from _submit_and_follow(ctx, session, lambda sup: sup.submit_fit(fit, settings, session=session),
                                  settings, info, pressed_at, poll_s)


def _worker_pool(ctx) -> Generator[tuple[str, Any], None, Any]:
    """The supervisor, once the pool is up (``sup = yield from _worker_pool(ctx)``), saying
    so while it starts; None, said why, when it could not start."""
    while not ctx.sup_ready.is_set():
        # a yield per second lets Gradio drop a closed tab's generator while it waits
        yield WAITING_FOR_POOL, None
        ctx.sup_ready.wait(1.0)
    if ctx.sup is None:
        yield ctx.sup_error or "the worker pool is not running", None
    return ctx.sup


def _submit_and_follow(ctx, session: str, submit, settings: Settings, info: Optional[JobInfo],
                       pressed_at: Optional[float], poll_s: float,
                       summary: Optional[str] = None) -> Iterator[tuple[str, Any]]:
    sup = yield from _worker_pool(ctx)
    if sup is None:
        return
    try:
        job = submit(sup)
    except Exception as e:  # noqa: BLE001 - queue full or a refused input: the person reads why
        log.warning("submit failed: %s", e)
        yield f"Could not start the job: {public_text(str(e))}", None
        return
    summary = summary or settings_summary(settings)
    ctx.summaries[job.id] = summary
    if info is not None:
        waited = max(0.0, time.time() - pressed_at) if pressed_at is not None else 0.0
        _save_info(job, replace(info, summary=summary, waited_s=waited))
    ctx.active.add(session, job.id)
    _ensure_reaper(ctx)
    if ctx.active.cancel_wanted(session):
        # Cancel was pressed while this press was still on its way to the worker pool
        _cancel(job)
    yield from _follow(ctx, session, job, poll_s)


def follow_existing(ctx, session: str, job_id: str, poll_s: float = 0.25) -> Iterator[tuple[str, Any]]:
    """Follow a job submitted earlier (by another page of the browser) as ``follow_job``
    does: ``("", JobStatus)`` on every change, ending with its terminal status."""
    job = ctx.sup.job(job_id)
    ctx.active.add(session, job_id)
    _ensure_reaper(ctx)
    yield from _follow(ctx, session, job, poll_s)


def _follow(ctx, session: str, job, poll_s: float) -> Iterator[tuple[str, Any]]:
    last = None
    try:
        for last in watch_job(job, poll_s, BEAT_S, on_poll=lambda: ctx.active.touch(job.id)):
            yield "", last
    finally:
        if last is not None and last.terminal:
            ctx.active.finished(job.id)
        elif ctx.active.cancel_wanted(session):
            _cancel(job)


def _cancel(job, reason: str = "") -> None:
    try:
        job.cancel(reason=reason)
    except Exception:  # noqa: BLE001 - the person is gone or pressed Cancel; the log keeps why
        log.exception("cancel of %s failed", job.id)


def settings_summary(settings: Settings) -> str:
    """'texture 1024px opt, 16 views, simplify 0.95, seed 0': what a person chose for a job."""
    b = settings.bake
    size = "auto" if str(b.texture_size) == "auto" else f"{b.texture_size}px"   # not "autopx"
    tex = f"texture {size} {b.mode}" if b.enabled else "vertex colours"
    ply = ", +ply" if settings.export.gaussians_ply else ""
    e = settings.export
    others = [f if f != "stl" or e.units == "m" else f"stl ({e.units})" for f in e.formats if f != "glb"]
    files = (", +" + ", +".join(others) if others else "") + \
        (f", {e.texture_format} texture" if e.texture_format != "png" and b.enabled else "")
    n = settings.views.count
    return (f"{tex}, {n} view{'s' if n != 1 else ''}, simplify {settings.mesh.simplify_ratio:g}, "
            f"seed {settings.seed}{ply}{files}")


def bake_summary(req: Any, settings: Settings) -> str:
    """'texture 1024px fast, camera fitted to the mask, splat, new UVs': what a bake of a
    model (``kiln.bakerequest.BakeRequest``) was asked, in the history's words: a photo job's
    views and seed mean nothing to it."""
    b, e = settings.bake, settings.export
    size = "auto" if str(b.texture_size) == "auto" else f"{b.texture_size}px"
    if not req.photo:
        camera = "no photo"
    elif req.camera_fitted:
        camera = "camera fitted before"
    elif req.camera is not None:
        camera = "camera file"
    elif req.focal is not None:
        camera = f"focal {float(req.focal):g}px"
    else:
        camera = "camera fitted to the mask"
    parts = [f"texture {size} {b.mode}", camera, "splat" if req.splat else "no splat",
             {"keep": "own UVs", "new": "new UVs"}.get(req.uvs, "UVs auto")]
    parts += [f"+{f}" for f in e.formats if f != "glb"]
    return ", ".join(parts)


# -- what a page reads ----------------------------------------------------------------

def browser_jobs(ctx, session: str) -> list:
    """Every job of the browser ``session`` belongs to (all its tabs, earlier servers'
    too: the supervisor reads the job store), oldest first; a cookie-less session's own."""
    if ctx.sup is None:
        return []
    if browser_of(session) is None:
        return ctx.sup.jobs(session)
    return [st for st in ctx.sup.jobs() if same_browser(session, st.session)]


# how many recent done jobs the status line's estimate takes, and how long it keeps one
TYPICAL_OF_LAST = 10
TYPICAL_KEEP_S = 30.0


def typical_job_seconds(ctx, kind: str = "image") -> Optional[float]:
    """The median run time (a worker's start of the job to its end; the wait in the queue
    left out) of the last done jobs of ``kind`` ("image": a model from a photo; "bake"),
    over every client, leaving out jobs that reused a cached reconstruction (seconds, not
    what a new photo takes); None before any. Worked out at most every ``TYPICAL_KEEP_S``: the
    status line and every followed job ask each second."""
    now = time.monotonic()
    kept = ctx.typical_job_s.get(kind)
    if kept is not None and now - kept[0] < TYPICAL_KEEP_S:
        return kept[1]
    value = None
    if ctx.sup is not None:
        times = []
        for st in ctx.sup.jobs():
            total = st.timings.get("total_s")
            reused = st.stats.pipeline is not None and st.stats.pipeline.reconstruction_cached
            if st.state == "done" and st.kind == kind and isinstance(total, (int, float)) and not reused:
                times.append(float(total) - float(st.timings.get("queued_s") or 0.0))
        times = times[-TYPICAL_OF_LAST:]
        value = float(np.median(times)) if times else None
    ctx.typical_job_s[kind] = (now, value)
    return value


# how many recent done jobs of a kind the cost model is fitted on
COST_OF_LAST = 30


def job_shape(ctx, st) -> Optional[JobShape]:
    """The shape of job ``st`` (``estimates.shape_of`` its ``settings.json``), kept by id: a
    job's settings never change; None when they cannot be read (its files were removed)."""
    shapes = ctx.job_shapes
    if st.id not in shapes:
        settings = stored_settings(ctx, st.id)
        picked = st.stats.pipeline.texture_size_auto if st.stats.pipeline is not None else None
        if settings is None:
            return None     # not kept: a job being created has no settings.json for a moment
        if len(shapes) > 4 * COST_OF_LAST:
            shapes.clear()
        shapes[st.id] = shape_of(settings, st.kind, picked)
    return shapes[st.id]


def cost_model(ctx, kind: str) -> Optional[CostModel]:
    """The cost model (``estimates.CostModel``) fitted on the last done jobs of ``kind``,
    every client's; None before any. Worked out at most every ``TYPICAL_KEEP_S``."""
    now = time.monotonic()
    models = ctx.cost_models
    kept = models.get(kind)
    if kept is not None and now - kept[0] < TYPICAL_KEEP_S:
        return kept[1]
    samples = []
    if ctx.sup is not None:
        done = [st for st in ctx.sup.jobs() if st.state == "done" and st.kind == kind
                and st.removed is None]
        for st in done[-COST_OF_LAST:]:
            shape = job_shape(ctx, st)
            p = st.stats.pipeline
            sample = sample_of(shape, st.timings, bool(p and p.reconstruction_cached),
                               p.views_cached if p else False) if shape is not None else None
            if sample is not None:
                samples.append(sample)
    model = CostModel.fit(samples)
    models[kind] = (now, model)
    return model


def job_estimate_s(ctx, st) -> Optional[float]:
    """Seconds job ``st`` should run (queue left out), from its own settings through the cost
    model of its kind (``cost_model``); what jobs of its kind took lately when its settings
    cannot be read or no job of its kind has stage timings; None before any job."""
    model = cost_model(ctx, st.kind)
    shape = job_shape(ctx, st) if model is not None else None
    if model is not None and shape is not None:
        return model.estimate(shape)
    return typical_job_seconds(ctx, st.kind)


def queue_load(ctx) -> tuple[int, int]:
    """(jobs running, jobs waiting) on the worker pool, every client's (the page's, the
    API's, a CLI's on the same pool); (0, 0) before the pool is up."""
    if ctx.sup is None:
        return 0, 0
    try:
        return ctx.sup.load()
    except Exception:  # noqa: BLE001 - only said on the page; the pool may be shutting down
        return 0, 0


def progress_views(ctx, steps, dom_id: str = "kiln-progress", shown: Optional[str] = None
                   ) -> Iterator[tuple[str, Any, Any]]:
    """``(note, status, view)`` for each ``(note, status)`` of ``follow_job`` / ``follow_bake`` /
    ``follow_existing``: ``view`` the progress bar's html when it changed (a note, the job's
    status, its place in line, a second more of its elapsed time), else ``gr.skip()`` (a beat
    that lets Gradio notice a page that went away). The end is ``gr.skip()`` too: the outcome
    shows it (``app.web.state.job_outcome``). ``shown``: the html the page shows already."""
    import gradio as gr

    for note, st in steps:
        if st is not None and st.terminal:
            view = None
        elif st is None:
            view = statusview.progress_html(note=note, dom_id=dom_id)
        else:   # a note beside a status names the object of several (``follow_each``)
            view = progress_view(ctx, st, dom_id, note=note)
        if view is None or view == shown:
            yield note, st, gr.skip()
        else:
            shown = view
            yield note, st, view


def progress_view(ctx, st, dom_id: str = "kiln-progress", note: str = "") -> str:
    """The progress bar of a job in progress as a page shows it: a waiting job's place in
    line and the wait to expect (what the running jobs have left, then the jobs ahead), a
    running one's elapsed time and what is left, all from what jobs took here lately."""
    place = ctx.sup.queue_place(st.id) if st.state == "queued" and ctx.sup is not None else None
    now = time.time()
    if place is not None:
        # the jobs ahead in line: what a job took here lately, their settings unknown to this page
        typical = typical_job_seconds(ctx, st.kind)
        left = running_left_s(ctx, typical, now) if typical else None
    else:
        typical, left = job_estimate_s(ctx, st), None
    return statusview.progress_html(st, dom_id=dom_id, place=place, workers=ctx.workers, typical_s=typical,
                                    now=now, running_left=left, note=note)


def running_left_s(ctx, fallback_s: float, now: float) -> list[float]:
    """What each job on a worker now has left: what its settings take here (``job_estimate_s``;
    else ``fallback_s``) less its time so far, 0 once past that."""
    out = []
    for st in ctx.sup.running():
        typical = job_estimate_s(ctx, st) or fallback_s
        out.append(max(0.0, typical - max(0.0, now - (st.started or now))))
    return out


def live_job(statuses) -> Optional[Any]:
    """The newest of ``statuses`` that is still queued or running, else None."""
    return next((st for st in reversed(list(statuses)) if not st.terminal), None)


def job_infos(ctx, statuses) -> dict[str, JobInfo]:
    """job id -> the ``JobInfo`` the page kept with it, for those that have one."""
    out = {}
    for st in statuses:
        info = _load_info(ctx, st.id)
        if info is not None:
            out[st.id] = info
    return out


def job_output(ctx, job_id: str, name: str):
    """The path of the job's output ``name`` (under its ``outputs/``), whether or not it exists
    yet; None when the job is unknown or there is no pool."""
    d = _job_dir(ctx, job_id) if ctx.sup is not None else None
    return d / "outputs" / name if d is not None else None


def _job_dir(ctx, job_id: str):
    try:
        return ctx.sup.job(job_id).dir
    except (AttributeError, KeyError):
        return None


def stored_settings(ctx, job_id: str) -> Optional[dict]:
    """The settings a job ran with (its ``settings.json``), None when unreadable."""
    d = _job_dir(ctx, job_id) if ctx.sup is not None else None
    try:
        return json.loads((d / "settings.json").read_text()) if d is not None else None
    except (OSError, ValueError):
        return None


def _load_info(ctx, job_id: str) -> Optional[JobInfo]:
    d = _job_dir(ctx, job_id) if ctx.sup is not None else None
    return load_info(d) if d is not None else None


def _save_info(job, info: JobInfo) -> None:
    try:
        save_info(job.dir, info)
    except (AttributeError, KeyError, OSError):
        # history then says "(image not known)"; the job itself is unaffected
        log.exception("could not keep the page's record of job %s", job.id)


def cancel_jobs(ctx, session: str, timeout_s: float = 8.0):
    """Cancel the jobs the tab ``session`` shows; their last one's status once it ended
    (or ``timeout_s`` passed), None when the tab showed no job. A Generate of the tab
    still on its way to the pool is cancelled as soon as it submits."""
    ctx.active.request_cancel(session)
    job_ids = ctx.active.get(session)
    if not job_ids or ctx.sup is None:
        return None
    handles = [ctx.sup.job(j) for j in job_ids]
    for h in handles:
        _cancel(h)
    deadline = time.monotonic() + timeout_s
    st = handles[-1].status()
    while not st.terminal and time.monotonic() < deadline:
        time.sleep(0.1)
        st = handles[-1].status()
    for h in handles:
        if h.status().terminal:    # at once, so the next Generate of the tab is not refused
            ctx.active.finished(h.id)
    return st


# -- jobs no page follows ---------------------------------------------------------------

def orphan_reason(grace_s: float) -> str:
    return f"cancelled: no page of this browser followed it for {grace_s:g} s"


def reap_orphans(ctx, now: Optional[float] = None) -> list[str]:
    """Cancel the page's jobs that no page followed for ``app.orphan_grace_s``; forget
    those that ended. Returns the ids cancelled."""
    grace = float(ctx.settings.app.orphan_grace_s)
    now = time.monotonic() if now is None else now
    cancelled = []
    for job_id, seen in ctx.active.followed().items():
        if ctx.sup is None:
            break
        try:
            job = ctx.sup.job(job_id)
            st = job.status()
        except KeyError:
            ctx.active.finished(job_id)
            continue
        if st.terminal:
            ctx.active.finished(job_id)
        elif now - seen >= grace:
            reason = orphan_reason(grace)
            info = _load_info(ctx, job_id) or JobInfo("")
            _save_info(job, replace(info, cancel_reason=reason))
            log.info("job %s: %s", job_id, reason)
            _cancel(job, reason)
            ctx.active.finished(job_id)
            cancelled.append(job_id)
    return cancelled


def _ensure_reaper(ctx) -> None:
    """Run ``reap_orphans`` on a thread of its own while the page has jobs that have not
    ended (the thread ends with the last of them)."""
    act = ctx.active
    with act.lock:
        if act.reaper is not None:
            return
        act.reaper = threading.Thread(target=_reap_loop, args=(ctx,), name="kiln-orphan-reaper",
                                      daemon=True)
        act.reaper.start()


def _reap_loop(ctx) -> None:
    act = ctx.active
    while True:
        time.sleep(min(1.0, float(ctx.settings.app.orphan_grace_s) / 4))
        with act.lock:
            if not act.touched:
                act.reaper = None
                return
        try:
            reap_orphans(ctx)
        except Exception:  # noqa: BLE001 - the reaper must outlive one bad tick
            log.exception("orphan reaper tick failed")
