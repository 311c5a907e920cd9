"""The Gradio page: layout and wiring. The logic lives in plain modules beside it
(``uploads``, ``selection``, ``form``, ``jobs``, ``statusview``, ``results``, ``history``).

Queues: Generate events of every session share the concurrency group "gpu"
whose limit is the number of workers, so Gradio's queue *is* the job queue (a
waiting user sees their place in it) and the supervisor never gets more jobs
from the UI than it has workers. Upload and click handlers run in their own
group, so people can segment while jobs run.
"""

from __future__ import annotations

import html
import logging
import time
from pathlib import Path

import gradio as gr

from kiln.settings import allowed_range, allowed_values

from . import form, history, jobs, messages, selection, statusview, uploads
from .requestinfo import client_of, refusal, session_of
from . import api
from .context import AppContext
from .examples import EXAMPLES

log = logging.getLogger(__name__)

CSS = """
#kiln-progress .kiln-bar { height: 14px; border-radius: 7px; background: var(--neutral-200); overflow: hidden; }
#kiln-progress .kiln-fill { height: 100%; background: var(--color-accent); transition: width .3s; }
#kiln-progress .kiln-fill.kiln-done { background: #2e9d4e; }
#kiln-progress .kiln-fill.kiln-failed, #kiln-progress .kiln-fill.kiln-cancelled { background: #c0392b; }
#kiln-progress .kiln-note { margin-top: 4px; font-size: 0.95em; }
#kiln-canvas img { cursor: crosshair; user-select: none; -webkit-user-drag: none; }
.kiln-hidden { display: none !important; }
#kiln-box-drag { position: fixed; border: 2px dashed #ffd200; outline: 1px solid #000;
                 pointer-events: none; z-index: 1000; }
#kiln-status details summary { cursor: pointer; display: inline; font-size: 0.9em; }
#kiln-status details { display: inline; margin-left: .5em; }
#kiln-status details[open] { display: block; margin-left: 0; }
.kiln-history-list { list-style: none; padding: 0; margin: 0; }
.kiln-job { display: flex; gap: .6em; align-items: flex-start; margin: .35em 0; }
.kiln-thumb { width: 56px; height: 56px; object-fit: contain; flex: none; background: var(--neutral-100); }
.kiln-job.kiln-failed, .kiln-job.kiln-cancelled { color: #a33; }
"""

# Dragging on the image draws a box (sent to the server through a hidden textbox and
# button); a plain click stays a click. Installed once per page by demo.load. A drag's own
# click event is swallowed, so Gradio's select does not add a point where the drag ended.
BOX_JS = """
() => {
  if (window.__kilnBox) return; window.__kilnBox = true;
  let start = null, suppress = false, rect = null;
  const MIN = 6;
  const target = (e) => e.target && e.target.closest ? e.target.closest('#kiln-canvas img') : null;
  const toPx = (img, cx, cy) => {
    const r = img.getBoundingClientRect(), nw = img.naturalWidth, nh = img.naturalHeight;
    const s = Math.min(r.width / nw, r.height / nh);
    const ox = r.left + (r.width - nw * s) / 2, oy = r.top + (r.height - nh * s) / 2;
    return [(cx - ox) / s, (cy - oy) / s];
  };
  const drawRect = (x0, y0, x1, y1) => {
    if (!rect) { rect = document.createElement('div'); rect.id = 'kiln-box-drag'; document.body.appendChild(rect); }
    Object.assign(rect.style, {left: Math.min(x0, x1) + 'px', top: Math.min(y0, y1) + 'px',
      width: Math.abs(x1 - x0) + 'px', height: Math.abs(y1 - y0) + 'px', display: 'block'});
  };
  const hideRect = () => { if (rect) rect.style.display = 'none'; };
  document.addEventListener('mousedown', (e) => {
    const img = target(e);
    if (!img || e.button !== 0) return;
    e.preventDefault();
    start = {img, x: e.clientX, y: e.clientY};
  }, true);
  document.addEventListener('mousemove', (e) => {
    if (!start) return;
    if (Math.hypot(e.clientX - start.x, e.clientY - start.y) < MIN) { hideRect(); return; }
    drawRect(start.x, start.y, e.clientX, e.clientY);
  }, true);
  document.addEventListener('mouseup', (e) => {
    if (!start) return;
    const s = start; start = null; hideRect();
    if (Math.hypot(e.clientX - s.x, e.clientY - s.y) < MIN) return;
    suppress = true; setTimeout(() => { suppress = false; }, 400);
    const [x0, y0] = toPx(s.img, s.x, s.y), [x1, y1] = toPx(s.img, e.clientX, e.clientY);
    const box = document.querySelector('#kiln-box-input textarea, #kiln-box-input input');
    const btn = document.querySelector('#kiln-box-btn');
    if (!box || !btn) return;
    const proto = box.tagName === 'TEXTAREA' ? HTMLTextAreaElement.prototype : HTMLInputElement.prototype;
    Object.getOwnPropertyDescriptor(proto, 'value').set.call(box,
      [x0, y0, x1, y1].map((v) => v.toFixed(1)).join(','));
    box.dispatchEvent(new Event('input', {bubbles: true}));
    setTimeout(() => btn.click(), 50);
  }, true);
  document.addEventListener('click', (e) => {
    if (suppress && target(e)) { suppress = false; e.stopPropagation(); e.preventDefault(); }
  }, true);
}
"""


GPU_GROUP = "gpu"


def gpu_queue_counts(demo: gr.Blocks) -> tuple[int, int]:
    """(running, waiting) Generate events in Gradio's "gpu" concurrency group.

    Reads Gradio's queue internals (stable through gradio 6.x, pinned <7);
    answers (0, 0) if they ever change rather than breaking the page.
    """
    try:
        q = demo._queue.event_queue_per_concurrency_id.get(GPU_GROUP)
        return (int(q.current_concurrency), len(q.queue)) if q is not None else (0, 0)
    except AttributeError:
        return 0, 0


def build_ui(ctx: AppContext, examples: list[Path] | None = None) -> gr.Blocks:
    from kiln.imageio import describe_limits, upload_limit_bytes

    s = ctx.settings
    upload_limits = describe_limits(s.app.max_pixels, upload_limit_bytes(s.app.max_pixels, s.app.max_upload_mb))

    # -- upload handlers (defined first: the Examples below need them) --------
    # A tab's state lives in ctx.sessions under the name the server derives from the
    # browser cookie and the tab, never in a gr.State: Gradio keys those by the session
    # hash the client sends, so another client could read or change them.
    def view(st: uploads.SessionState):
        alpha_vis = gr.update(visible=bool(st.image and st.image.has_alpha), value=st.use_alpha)
        return selection.render_overlay(st), selection.mask_summary(st), alpha_vis

    def busy(session: str) -> bool:
        """This tab has a Generate waiting or a job running."""
        return bool(ctx.active.get(session)) or session in ctx.active.pending

    def on_upload(path, request: gr.Request):
        """-> (canvas, mask info, alpha checkbox, file box, progress, mask file box). A refused
        file is taken out of the file box so the drop zone is back, and the reason stays shown.
        A new image clears the last job's text (unless this tab's job still runs) and the mask file."""
        session, client = session_of(request), client_of(request)
        fresh = gr.skip() if busy(session) else statusview.progress_html()
        with ctx.sessions.edit(session, client) as (_, save):
            if not path:
                save(uploads.SessionState())
                return (*view(uploads.SessionState()), gr.skip(), fresh, None)
            try:
                ctx.sessions.admit(session, client, Path(path).stat().st_size)
                with ctx.decodes:   # a 40 MP decode takes ~160 MB for a moment
                    st = uploads.load_upload(path, s.app, name=Path(path).name)
                save(st)
            except (messages.UIError, OSError) as e:
                text = messages.public_text(str(e))
                gr.Warning(text)
                save(uploads.SessionState())
                return (None, f"**Cannot use this file:** {html.escape(text)}",
                        gr.update(visible=False, value=False), None, fresh, None)
        selection.prepare_segmenter(st, ctx.segmenter)
        return (*view(st), gr.skip(), fresh, None)

    # every click writes an overlay JPEG into Gradio's folder: sweep hourly, keep a day
    with gr.Blocks(title="Kiln — photo to 3D", delete_cache=(3600, 86400)) as demo:
        gr.Markdown("# Kiln\nUpload a photo, click the object, press **Generate** to get a textured 3D model (GLB).")
        status_md = gr.Markdown(elem_id="kiln-status")

        with gr.Row(equal_height=False):
            with gr.Column(scale=1):
                upload = gr.File(label=f"Image (PNG, JPEG, WebP, TIFF…; {upload_limits})", file_types=["image"],
                                 file_count="single", type="filepath", elem_id="kiln-upload", height=110)
                canvas = gr.Image(label="Click the object or drag a box around it "
                                        "(green = object, red = background)",
                                  interactive=False, type="numpy", format="jpeg", elem_id="kiln-canvas",
                                  buttons=["fullscreen"], height=460)
                mask_md = gr.Markdown(selection.mask_summary(uploads.SessionState()), elem_id="kiln-mask-info")
                with gr.Row():
                    background = gr.Checkbox(label="Background clicks", value=False, elem_id="kiln-bg")
                    show_mask = gr.Checkbox(label="Show selection", value=True, elem_id="kiln-show-mask",
                                            info="off: the photo alone")
                    use_alpha = gr.Checkbox(label="Use transparency as mask", value=False, visible=False,
                                            elem_id="kiln-alpha")
                with gr.Row():
                    undo_btn = gr.Button("Undo", size="sm", elem_id="kiln-undo")
                    clear_btn = gr.Button("Clear selection", size="sm", elem_id="kiln-clear")
                mask_file = gr.File(label="Or a mask file (same size as the image; alpha or white = object)",
                                    file_types=["image"], file_count="single", type="filepath",
                                    elem_id="kiln-mask-file", height=90)
                # the drag-a-box script (BOX_JS) writes "x0,y0,x1,y1" here and presses the button
                box_input = gr.Textbox(elem_id="kiln-box-input", elem_classes=["kiln-hidden"],
                                       show_label=False, container=False)
                box_btn = gr.Button("box", elem_id="kiln-box-btn", elem_classes=["kiln-hidden"])
                progress = gr.HTML(statusview.progress_html(), elem_id="kiln-progress-box", render=False)
                upload_outputs = [canvas, mask_md, use_alpha, upload, progress, mask_file]
                if examples:
                    captions = dict(EXAMPLES)
                    gr.Examples(examples=[[str(p)] for p in examples], inputs=[upload],
                                outputs=upload_outputs, fn=on_upload, run_on_click=True,
                                example_labels=[f"{p.name}: {captions[p.name]}" if p.name in captions
                                                else p.name for p in examples],
                                cache_examples=False, label="Examples (generated by Kiln)")

            with gr.Column(scale=1):
                with gr.Accordion("Settings", open=True):
                    with gr.Row():
                        bake = gr.Checkbox(label="Bake texture", value=s.bake.enabled, elem_id="kiln-bake",
                                           info="off: vertex colours, faster")
                        ply = gr.Checkbox(label="Also export Gaussians (.ply)", value=s.export.gaussians_ply,
                                          elem_id="kiln-ply")
                    with gr.Row():
                        # widget limits come from the settings' own ranges (one source)
                        tex_choices = ["auto"] + list(allowed_values("bake.texture_size"))
                        texture = gr.Dropdown(label="Texture size", choices=tex_choices,
                                              value=s.bake.texture_size, elem_id="kiln-texture",
                                              interactive=s.bake.enabled)
                        mode = gr.Radio(label="Bake mode", choices=list(allowed_values("bake.mode")),
                                        value=s.bake.mode, elem_id="kiln-mode",
                                        info="fast: back-projection; opt: optimised", interactive=s.bake.enabled)
                    views_lo, views_hi = allowed_range("views.count")
                    views = gr.Slider(label="Bake views", minimum=views_lo, maximum=views_hi, step=1,
                                      value=s.views.count, elem_id="kiln-views")
                    ratio_lo, ratio_hi = allowed_range("mesh.simplify_ratio")
                    simplify = gr.Slider(label="Simplify ratio (fraction of faces removed)", minimum=ratio_lo,
                                         maximum=ratio_hi, step=0.005, value=s.mesh.simplify_ratio,
                                         elem_id="kiln-simplify")
                    # no minimum here: Gradio's own refusal would not name the box; job_settings does
                    seed = gr.Number(label="Seed", value=s.seed, precision=0, elem_id="kiln-seed")
                with gr.Row():
                    generate_btn = gr.Button("Generate", variant="primary", elem_id="kiln-generate")
                    cancel_btn = gr.Button("Cancel", variant="stop", elem_id="kiln-cancel", interactive=False)
                progress.render()
                model = gr.Model3D(label="Result", elem_id="kiln-model", height=420,
                                   clear_color=(0.93, 0.93, 0.95, 1.0))
                with gr.Row():
                    glb_btn = gr.DownloadButton("Download GLB", visible=False, elem_id="kiln-dl-glb")
                    ply_btn = gr.DownloadButton("Download Gaussians (.ply)", visible=False, elem_id="kiln-dl-ply")
                with gr.Accordion("History (this browser)", open=False):
                    history_md = gr.HTML(history.history_html([]), elem_id="kiln-history")
                    history_files = gr.File(label="Earlier results", file_count="multiple",
                                            interactive=False, elem_id="kiln-history-files")

        timer = gr.Timer(2.0)
        settings_inputs = [bake, simplify, texture, views, mode, seed, ply]

        def edit_session(request: gr.Request, change):
            """Apply ``change(state) -> state`` to this tab's state and show the result."""
            with ctx.sessions.edit(session_of(request), client_of(request)) as (st, save):
                try:
                    st = change(st)
                    save(st)
                except messages.UIError as e:
                    gr.Warning(messages.public_text(str(e)))
            return view(st)

        def on_click(bg: bool, evt: gr.SelectData, request: gr.Request):
            x, y = evt.index[0], evt.index[1]
            return edit_session(request, lambda st: selection.add_click(st, float(x), float(y), bool(bg),
                                                                ctx.segmenter))

        def on_undo(request: gr.Request):
            return edit_session(request, lambda st: selection.undo_click(st, ctx.segmenter))

        def on_clear(request: gr.Request):
            return edit_session(request, selection.clear_clicks)

        def on_alpha(on, request: gr.Request):
            return edit_session(request, lambda st: uploads.set_use_alpha(st, bool(on)))

        def on_show_mask(on, request: gr.Request):
            return edit_session(request, lambda st: uploads.set_show_mask(st, bool(on)))

        def on_box(text, request: gr.Request):
            try:
                x0, y0, x1, y1 = (float(v) for v in str(text).split(","))
            except ValueError:
                return (gr.skip(),) * 3
            return edit_session(request, lambda st: selection.set_box(st, x0, y0, x1, y1, ctx.segmenter))

        def on_mask_file(path, request: gr.Request):
            """-> (canvas, mask info, alpha checkbox, mask file box); a refused file leaves the
            box empty and says why under the image."""
            if not path:
                return (*edit_session(request, selection.clear_clicks), gr.skip())
            with ctx.sessions.edit(session_of(request), client_of(request)) as (st, save):
                try:
                    with ctx.decodes:   # the mask file is decoded at full size
                        st = uploads.set_mask_file(st, path, s.app, name=Path(path).name)
                    save(st)
                except messages.UIError as e:
                    text = messages.public_text(str(e))
                    gr.Warning(text)
                    canvas_v, _, alpha_v = view(st)
                    return canvas_v, f"**Cannot use this mask:** {html.escape(text)}", alpha_v, None
            return (*view(st), gr.skip())

        def on_upload_cleared(request: gr.Request):
            ctx.sessions.drop(session_of(request))
            return view(uploads.SessionState())

        seg_outputs = [canvas, mask_md, use_alpha]
        seg_kw = dict(concurrency_id="segment", concurrency_limit=4, show_progress="minimal")
        # .upload/.clear fire on what the person does only, not when a handler sets the box
        upload.upload(on_upload, [upload], upload_outputs, **seg_kw)
        upload.clear(on_upload_cleared, None, seg_outputs, **seg_kw)
        canvas.select(on_click, [background], seg_outputs, **seg_kw)
        undo_btn.click(on_undo, None, seg_outputs, **seg_kw)
        clear_btn.click(on_clear, None, seg_outputs, **seg_kw)
        use_alpha.input(on_alpha, [use_alpha], seg_outputs, **seg_kw)
        show_mask.input(on_show_mask, [show_mask], seg_outputs, **seg_kw)
        box_btn.click(on_box, [box_input], seg_outputs, **seg_kw)
        mask_file.upload(on_mask_file, [mask_file], seg_outputs + [mask_file], **seg_kw)
        mask_file.clear(on_mask_file, [mask_file], seg_outputs + [mask_file], **seg_kw)
        demo.load(None, None, None, js=BOX_JS)
        # texture size and bake mode mean nothing without baking
        bake.change(lambda on: (gr.update(interactive=bool(on)),) * 2, [bake], [texture, mode],
                    queue=False, show_progress="hidden")

        # -- jobs ------------------------------------------------------------
        # Gradio 6.31's Model3D never mounts its viewer when a generator sets its value, so
        # run_job streams only the progress bar and leaves the outcome (bar, files, history)
        # in ctx.outcomes (by session name, not in a gr.State) for one plain .then() handler.
        # Jobs belong to the browser, not the tab: a page loaded later (a reload, a second
        # tab) shows the browser's history and follows its running job (app/jobs.py).
        def idle_buttons():
            # fresh dicts each time: Gradio consumes an update's keys as it applies it, so a
            # shared tuple came back without its value and left the button saying "Running…"
            return (gr.update(value="Generate", interactive=True), gr.update(interactive=False))

        def running_buttons():
            return (gr.update(value="Running…", interactive=False), gr.update(interactive=True))

        result_outputs = [progress, model, glb_btn, ply_btn, history_md, history_files,
                          generate_btn, cancel_btn]
        pressed_at: dict[str, float] = {}       # session -> when its Generate was pressed

        def session_history(session: str, statuses=None):
            """(history HTML, history files) of the tab's browser: all its tabs' jobs."""
            if ctx.sup is None:
                return history.history_html([]), None, {}
            statuses = jobs.browser_jobs(ctx, session) if statuses is None else statuses
            infos = jobs.job_infos(ctx, statuses)
            files = history.history_files(session, statuses, ctx.publisher, infos)
            return history.history_html(statuses, ctx.summaries, infos), [p for p, _ in files] or None

        def keep_outcome(session: str, last, waited_s: float = 0.0) -> None:
            """Publish a finished job's files (named '<image>-<n>.glb') and leave the outcome
            for show_outcome."""
            note, files = "", {}
            statuses = jobs.browser_jobs(ctx, session)
            if last.state == "done":
                try:
                    stems = history.result_stems(statuses, jobs.job_infos(ctx, statuses))
                    files = ctx.publisher.publish(session, last, stems.get(last.id))
                except (OSError, messages.UIError) as e:
                    log.exception("publishing %s failed", last.id)
                    note = f"the result could not be prepared for download: {messages.public_text(str(e))}"
            hist_md, hist_files = session_history(session, statuses)
            ctx.outcomes[session] = {"progress": statusview.progress_html(last, note=note, waited_s=waited_s),
                                     "history": (hist_md, hist_files), "job": last.id,
                                     **{kind: str(path) for kind, path in files.items()}}

        def check_before_queue(bake_on, ratio, tex, n_views, bake_mode, seed_v, ply_on,
                               request: gr.Request):
            """Refuse at once what cannot run, before the job waits for a worker slot, and
            clear the previous result. Queued in a group of its own so it runs at once:
            Gradio 6.31 shows no gr.Error raised by a queue=False event. The setting boxes
            then show the values the job will use (e.g. the seed rounded to a whole number)."""
            session = session_of(request)
            st = ctx.sessions.get(session)
            if st.image is None:
                raise refusal("Upload an image first.")
            if busy(session):
                raise refusal("This page's job is still running; wait for it or press Cancel.")
            try:
                used = form.check_job_request(st, s, bake_on, ratio, tex, n_views, bake_mode, seed_v, ply_on)
            except messages.UIError as e:
                raise refusal(messages.public_text(str(e))) from None
            if ctx.sup_error:
                raise refusal(messages.public_text(ctx.sup_error))
            running, waiting = gpu_queue_counts(demo)
            if waiting >= s.worker.max_queue:
                raise refusal(f"The job queue is full ({waiting} waiting); try again in a few minutes.")
            ctx.active.set_pending(session, True)
            ctx.outcomes.pop(session, None)   # a run_job cancelled early must not re-show the last one
            pressed_at[session] = time.time()
            note = "Starting…"
            if running + waiting >= ctx.workers:
                note = "Waiting for a free worker" + (f" ({waiting} other jobs waiting)…" if waiting else "…")
            hidden = gr.update(visible=False)
            return (statusview.progress_html(note=note), None, hidden, hidden, *running_buttons(),
                    used.views.count, used.mesh.simplify_ratio, used.seed)

        def run_job(bake_on, ratio, tex, n_views, bake_mode, seed_v, ply_on, request: gr.Request):
            """Yields the progress bar; leaves the outcome in ctx.outcomes for show_outcome."""
            session = session_of(request)
            last, shown = None, None
            pressed = pressed_at.pop(session, None)
            try:
                # pending (for Cancel) until follow_job submits the job, e.g. while the pool starts
                st_now = ctx.sessions.get(session)
                info = None
                if st_now.image is not None:
                    info = history.JobInfo(st_now.image.name, history.thumbnail_uri(st_now.image.work))
                with ctx.decodes:   # the full-size image is decoded again for the job
                    request_ = form.job_request(st_now, s, bake_on, ratio, tex,
                                                n_views, bake_mode, seed_v, ply_on)
                del st_now
                # follow_job lets go of the full-size arrays once the job store has them
                steps = jobs.follow_job(ctx, session, *request_, info=info, pressed_at=pressed)
                del request_
                for note, last in steps:
                    if last is None:
                        yield statusview.progress_html(note=note)
                    elif last.terminal or last.seq == shown:
                        yield gr.skip()     # a beat: lets Gradio notice a page that went away
                    else:
                        shown = last.seq
                        yield statusview.progress_html(last)
            except messages.UIError as e:
                note = f"Cannot start: {messages.public_text(str(e))}"
            finally:
                ctx.active.set_pending(session, False)
            if last is None:
                ctx.outcomes[session] = {"progress": statusview.progress_html(note=note)}
                yield gr.skip()
                return
            # the wait in Gradio's queue before the job was submitted counts in "Done in"
            keep_outcome(session, last, max(0.0, (last.created or 0.0) - (pressed or last.created or 0.0)))
            yield gr.skip()

        def show_outcome(request: gr.Request, idle_when_empty: bool = True):
            session = session_of(request)
            out = ctx.outcomes.pop(session, None)
            if not out:
                skips = (gr.skip(),) * (len(result_outputs) - 2)
                return skips + (idle_buttons() if idle_when_empty else (gr.skip(), gr.skip()))
            glb, plyf = out.get("glb"), out.get("ply")
            hist_md, hist_files = out.get("history", (gr.skip(), gr.skip()))
            return (out["progress"], glb or gr.skip(),
                    gr.update(value=glb, visible=True) if glb else gr.update(visible=False),
                    gr.update(value=plyf, visible=True) if plyf else gr.update(visible=False),
                    hist_md, hist_files, *idle_buttons())

        gen_event = generate_btn.click(
            check_before_queue, settings_inputs,
            [progress, model, glb_btn, ply_btn, generate_btn, cancel_btn, views, simplify, seed],
            concurrency_id="check", concurrency_limit=None, show_progress="hidden",
        ).success(
            run_job, settings_inputs, [progress],
            concurrency_id=GPU_GROUP, concurrency_limit=ctx.workers, show_progress="hidden",
        )
        gen_event.then(show_outcome, None, result_outputs, queue=False, show_progress="hidden")

        def follow_on_load(request: gr.Request):
            """A page just loaded (a reload, another tab): once the workers are up, show the
            browser's history, its newest job's settings in the form and, if that job is
            queued or running, follow it here with live progress (Cancel works on it; the
            result lands here when done); if it ended, show its outcome as before the reload."""
            session = session_of(request)
            n_form = len(settings_inputs)
            skip = (gr.skip(),) * (5 + n_form)
            while not ctx.sup_ready.is_set():
                yield skip      # a beat a second: Gradio drops the generator of a closed page
                ctx.sup_ready.wait(1.0)
            if ctx.sup is None:
                yield skip
                return
            statuses = jobs.browser_jobs(ctx, session)
            live = jobs.live_job(statuses)
            newest = statuses[-1] if statuses else None
            idle = not busy(session)      # else this page's own Generate shows its job
            hist_md, hist_files = session_history(session, statuses)
            shown_form = (gr.skip(),) * n_form
            if newest is not None and idle:
                shown_form = form.form_values(jobs.job_settings(ctx, newest.id)) or shown_form
            if live is None or not idle:
                if newest is not None and idle:
                    # the page looks as it did before the reload: the last result in the viewer
                    info = jobs.job_infos(ctx, [newest]).get(newest.id)
                    keep_outcome(session, newest, info.waited_s if info is not None else 0.0)
                yield (gr.skip(), gr.skip(), gr.skip(), hist_md, hist_files, *shown_form)
                return
            info = jobs.job_infos(ctx, [live]).get(live.id)
            yield (statusview.progress_html(live), *running_buttons(), hist_md, hist_files, *shown_form)
            last, shown = live, live.seq
            for _, last in jobs.follow_existing(ctx, session, live.id):
                if last.terminal or last.seq == shown:
                    yield skip
                else:
                    shown = last.seq
                    yield (statusview.progress_html(last),) + (gr.skip(),) * (4 + n_form)
            if last.terminal:
                keep_outcome(session, last, info.waited_s if info is not None else 0.0)
            yield skip

        load_event = demo.load(follow_on_load, None,
                               [progress, generate_btn, cancel_btn, history_md, history_files,
                                *settings_inputs],
                               concurrency_id="follow", concurrency_limit=None, show_progress="hidden")
        def show_followed_outcome(request: gr.Request):
            return show_outcome(request, idle_when_empty=False)

        load_event.then(show_followed_outcome, None, result_outputs, queue=False, show_progress="hidden")

        def on_cancel(request: gr.Request):
            session = session_of(request)
            pressed_at.pop(session, None)
            st = jobs.cancel_jobs(ctx, session)
            if st is None:
                if ctx.active.take_pending(session):
                    # the Generate still waiting in Gradio's queue is dropped by `cancels=` below
                    return statusview.progress_html(note="Cancelled before it started."), *idle_buttons()
                return statusview.progress_html(note="Nothing to cancel."), *idle_buttons()
            return statusview.progress_html(st), *idle_buttons()

        cancel_btn.click(on_cancel, None, [progress, generate_btn, cancel_btn], cancels=[gen_event, load_event],
                         queue=False)

        # -- status line, history on load ------------------------------------
        def on_status():
            running, waiting = gpu_queue_counts(demo)
            if ctx.sup is not None:
                try:
                    waiting += ctx.sup.queue_length()   # jobs from other clients (CLI) too
                except Exception:  # noqa: BLE001 - status line only
                    pass
            note = ctx.sup_error or ("" if ctx.sup_ready.is_set() else "workers starting…")
            return messages.public_text(statusview.status_line(ctx.capabilities(), ctx.segmenter_text, running, waiting,
                                               note))

        timer.tick(on_status, None, [status_md], show_progress="hidden", queue=False)

        def on_load(request: gr.Request):
            hist_md, hist_files = session_history(session_of(request))
            return on_status(), hist_md, hist_files

        demo.load(on_load, None, [status_md, history_md, history_files], queue=False)

        def on_restore(request: gr.Request):
            """A page loaded: a reload (or a new tab) takes over the browser's newest image,
            clicks and mask (app/sessions.py ``adopt``)."""
            st = ctx.sessions.adopt(session_of(request), client_of(request))
            if st.image is None:
                return (gr.skip(),) * 4
            return (*view(st), gr.update(value=st.show_mask))

        def prepare_restored(request: gr.Request):
            selection.prepare_segmenter(ctx.sessions.get(session_of(request)), ctx.segmenter)

        demo.load(on_restore, None, seg_outputs + [show_mask], queue=False).then(
            prepare_restored, None, None, **{**seg_kw, "show_progress": "hidden"})

        def on_unload(request: gr.Request):
            # the tab closed (its heartbeat ended): park its image for the browser's next
            # page (a reload), free its outcome now; its job goes on for the browser's next
            # page until app.orphan_grace_s passes unfollowed
            session = session_of(request)
            ctx.sessions.park(session)
            ctx.outcomes.pop(session, None)
            ctx.active.drop_session(session)

        demo.unload(on_unload)
    api.register(demo, ctx)   # the script endpoints (docs/api.md); hides the page's own
    return demo

