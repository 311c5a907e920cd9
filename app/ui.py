"""The Gradio page: layout and wiring. The logic lives in ``app/handlers.py``.

Queues: Generate events of every session share the concurrency group "gpu"
whose limit is the number of workers, so Gradio's queue *is* the job queue (a
waiting user sees their place in it) and the supervisor never gets more jobs
from the UI than it has workers. Upload and click handlers run in their own
group, so people can segment while jobs run.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import gradio as gr

from . import handlers as H
from .context import AppContext
from .examples import EXAMPLES

log = logging.getLogger(__name__)

CSS = """
#kiln-progress .kiln-bar { height: 14px; border-radius: 7px; background: var(--neutral-200); overflow: hidden; }
#kiln-progress .kiln-fill { height: 100%; background: var(--color-accent); transition: width .3s; }
#kiln-progress .kiln-fill.kiln-done { background: #2e9d4e; }
#kiln-progress .kiln-fill.kiln-failed, #kiln-progress .kiln-fill.kiln-cancelled { background: #c0392b; }
#kiln-progress .kiln-note { margin-top: 4px; font-size: 0.95em; }
#kiln-canvas img { cursor: crosshair; }
"""

TEXTURE_SIZES = [256, 512, 1024, 2048]
GPU_GROUP = "gpu"


def session_of(request: gr.Request | None) -> str:
    """This browser tab's session name (see ``handlers.session_name``)."""
    cookies = getattr(request, "cookies", None) if request is not None else None
    token = cookies.get(H.BROWSER_COOKIE) if cookies is not None else None
    return H.session_name(token, getattr(request, "session_hash", None))


def refusal(message: str) -> gr.Error:
    """A gr.Error for something the person can fix: shown, but no traceback in the log."""
    return gr.Error(message, print_exception=False)


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
    s = ctx.settings

    # -- upload handlers (defined first: the Examples below need them) --------
    def view(st: H.SessionState):
        alpha_vis = gr.update(visible=bool(st.image and st.image.has_alpha), value=st.use_alpha)
        return st, H.render_overlay(st), H.mask_summary(st), alpha_vis

    def on_upload(path):
        """-> (state, canvas, mask info, alpha checkbox, file box). A refused file is
        taken out of the file box so the drop zone is back, and the reason stays shown."""
        if not path:
            return (*view(H.SessionState()), gr.skip())
        try:
            st = H.load_upload(path, s.app, name=Path(path).name)
        except H.UIError as e:
            gr.Warning(str(e))
            return (H.SessionState(), None, f"**Cannot use this file:** {e}",
                    gr.update(visible=False, value=False), None)
        H.prepare_segmenter(st, ctx.segmenter)
        return (*view(st), gr.skip())

    # every click writes an overlay JPEG into Gradio's folder: sweep hourly, keep a day
    with gr.Blocks(title="Kiln — photo to 3D", delete_cache=(3600, 86400)) as demo:
        # Gradio drops a tab's state when it closes; the TTL covers tabs left open for hours
        state = gr.State(H.SessionState(), time_to_live=6 * 3600)
        gr.Markdown("# Kiln\nUpload a photo, click the object, press **Generate** to get a textured 3D model (GLB).")
        status_md = gr.Markdown(elem_id="kiln-status")

        with gr.Row(equal_height=False):
            with gr.Column(scale=1):
                upload = gr.File(label="Image (PNG, JPEG, WebP, TIFF…)", file_types=["image"],
                                 file_count="single", type="filepath", elem_id="kiln-upload", height=110)
                canvas = gr.Image(label="Click the object (green = object, red = background)",
                                  interactive=False, type="numpy", format="jpeg", elem_id="kiln-canvas",
                                  buttons=["fullscreen"], height=460)
                mask_md = gr.Markdown(H.mask_summary(H.SessionState()), elem_id="kiln-mask-info")
                with gr.Row():
                    background = gr.Checkbox(label="Background clicks", value=False, elem_id="kiln-bg")
                    use_alpha = gr.Checkbox(label="Use transparency as mask", value=False, visible=False,
                                            elem_id="kiln-alpha")
                with gr.Row():
                    undo_btn = gr.Button("Undo click", size="sm", elem_id="kiln-undo")
                    clear_btn = gr.Button("Clear clicks", size="sm", elem_id="kiln-clear")
                upload_outputs = [state, canvas, mask_md, use_alpha, upload]
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
                        tex_choices = sorted(set(TEXTURE_SIZES) | {s.bake.texture_size})
                        texture = gr.Dropdown(label="Texture size", choices=tex_choices,
                                              value=s.bake.texture_size, elem_id="kiln-texture")
                        mode = gr.Radio(label="Bake mode", choices=["fast", "opt"], value=s.bake.mode,
                                        elem_id="kiln-mode", info="fast: back-projection; opt: optimised")
                    views = gr.Slider(label="Bake views", minimum=1, maximum=64, step=1,
                                      value=s.views.count, elem_id="kiln-views")
                    simplify = gr.Slider(label="Simplify ratio (fraction of faces removed)", minimum=0.0,
                                         maximum=0.99, step=0.005, value=s.mesh.simplify_ratio,
                                         elem_id="kiln-simplify")
                    seed = gr.Number(label="Seed", value=s.seed, precision=0, minimum=0, elem_id="kiln-seed")
                with gr.Row():
                    generate_btn = gr.Button("Generate", variant="primary", elem_id="kiln-generate")
                    cancel_btn = gr.Button("Cancel", variant="stop", elem_id="kiln-cancel")
                progress = gr.HTML(H.progress_html(), elem_id="kiln-progress-box")
                model = gr.Model3D(label="Result", elem_id="kiln-model", height=420,
                                   clear_color=(0.93, 0.93, 0.95, 1.0))
                with gr.Row():
                    glb_btn = gr.DownloadButton("Download GLB", visible=False, elem_id="kiln-dl-glb")
                    ply_btn = gr.DownloadButton("Download Gaussians (.ply)", visible=False, elem_id="kiln-dl-ply")
                with gr.Accordion("History (this session)", open=False):
                    history_md = gr.Markdown(H.history_markdown([]), elem_id="kiln-history")
                    history_files = gr.File(label="Earlier results", file_count="multiple",
                                            interactive=False, elem_id="kiln-history-files")

        timer = gr.Timer(2.0)
        settings_inputs = [bake, simplify, texture, views, mode, seed, ply]

        def on_click(st: H.SessionState, bg: bool, evt: gr.SelectData):
            try:
                x, y = evt.index[0], evt.index[1]
                st = H.add_click(st, float(x), float(y), bool(bg), ctx.segmenter)
            except H.UIError as e:
                gr.Warning(str(e))
            return view(st)

        def on_undo(st):
            return view(H.undo_click(st, ctx.segmenter))

        def on_clear(st):
            return view(H.clear_clicks(st))

        def on_alpha(st, on):
            return view(H.set_use_alpha(st, bool(on)))

        seg_outputs = [state, canvas, mask_md, use_alpha]
        seg_kw = dict(concurrency_id="segment", concurrency_limit=4, show_progress="minimal")
        # .upload/.clear fire on what the person does only, not when a handler sets the box
        upload.upload(on_upload, [upload], upload_outputs, **seg_kw)
        upload.clear(lambda: view(H.SessionState()), None, seg_outputs, **seg_kw)
        canvas.select(on_click, [state, background], seg_outputs, **seg_kw)
        undo_btn.click(on_undo, [state], seg_outputs, **seg_kw)
        clear_btn.click(on_clear, [state], seg_outputs, **seg_kw)
        use_alpha.input(on_alpha, [state, use_alpha], seg_outputs, **seg_kw)

        # -- jobs ------------------------------------------------------------
        # Gradio 6.31's Model3D never mounts its viewer when a generator sets its value, so
        # run_job streams only the progress bar and leaves the outcome (bar, files, history)
        # in a State that one plain .then() handler shows.
        outcome = gr.State(None)
        result_outputs = [progress, model, glb_btn, ply_btn, history_md, history_files]

        def history(session: str):
            if ctx.sup is None:
                return H.history_markdown([]), []
            statuses = ctx.sup.jobs(session)
            return (H.history_markdown(statuses, ctx.summaries),
                    H.history_files(session, statuses, ctx.publisher) or None)

        def check_before_queue(st, bake_on, ratio, tex, n_views, bake_mode, seed_v, ply_on,
                               request: gr.Request):
            """Refuse at once what cannot run, before the job waits for a worker slot, and
            clear the previous result. Queued in a group of its own so it runs at once:
            Gradio 6.31 shows no gr.Error raised by a queue=False event."""
            if st.image is None:
                raise refusal("Upload an image first.")
            try:
                H.job_request(st, s, bake_on, ratio, tex, n_views, bake_mode, seed_v, ply_on)
            except H.UIError as e:
                raise refusal(str(e)) from None
            if ctx.sup_error:
                raise refusal(ctx.sup_error)
            running, waiting = gpu_queue_counts(demo)
            if waiting >= s.worker.max_queue:
                raise refusal(f"The job queue is full ({waiting} waiting); try again in a few minutes.")
            ctx.active.set_pending(session_of(request), True)
            note = "Starting…"
            if running + waiting >= ctx.workers:
                note = "Waiting for a free worker" + (f" ({waiting} other jobs waiting)…" if waiting else "…")
            hidden = gr.update(visible=False)
            # outcome None: a run_job cancelled before its end must not re-show the previous result
            return H.progress_html(note=note), None, hidden, hidden, None

        def run_job(st, bake_on, ratio, tex, n_views, bake_mode, seed_v, ply_on, request: gr.Request):
            """Yields (progress bar, outcome); the outcome is a dict for show_outcome."""
            session = session_of(request)
            last = None
            try:
                # pending (for Cancel) until follow_job submits the job, e.g. while the pool starts
                rgb, mask, settings = H.job_request(st, s, bake_on, ratio, tex, n_views, bake_mode,
                                                    seed_v, ply_on)
                for note, last in H.follow_job(ctx, session, rgb, mask, settings):
                    if last is None:
                        yield H.progress_html(note=note), gr.skip()
                    elif not last.terminal:
                        yield H.progress_html(last), gr.skip()
            except H.UIError as e:
                note = f"Cannot start: {e}"
            finally:
                ctx.active.set_pending(session, False)
            if last is None:
                yield gr.skip(), {"progress": H.progress_html(note=note)}
                return
            note, files = "", {}
            if last.state == "done":
                try:
                    files = ctx.publisher.publish(session, last)
                except (OSError, H.UIError) as e:
                    log.exception("publishing %s failed", last.id)
                    note = f"the result could not be prepared for download: {e}"
            hist_md, hist_files = history(session)
            yield gr.skip(), {"progress": H.progress_html(last, note=note), "history": (hist_md, hist_files),
                              **{kind: str(path) for kind, path in files.items()}}

        def show_outcome(out: dict | None):
            if not out:
                return (gr.skip(),) * len(result_outputs)
            glb, plyf = out.get("glb"), out.get("ply")
            hist_md, hist_files = out.get("history", (gr.skip(), gr.skip()))
            return (out["progress"], glb or gr.skip(),
                    gr.update(value=glb, visible=True) if glb else gr.update(visible=False),
                    gr.update(value=plyf, visible=True) if plyf else gr.update(visible=False),
                    hist_md, hist_files)

        gen_event = generate_btn.click(
            check_before_queue, [state, *settings_inputs], [progress, model, glb_btn, ply_btn, outcome],
            concurrency_id="check", concurrency_limit=None, show_progress="hidden",
        ).success(
            run_job, [state, *settings_inputs], [progress, outcome],
            concurrency_id=GPU_GROUP, concurrency_limit=ctx.workers, show_progress="hidden",
        )
        gen_event.then(show_outcome, [outcome], result_outputs, queue=False, show_progress="hidden")

        def on_cancel(request: gr.Request):
            session = session_of(request)
            job_ids = ctx.active.get(session)
            if not job_ids or ctx.sup is None:
                if ctx.active.take_pending(session):
                    # the Generate still waiting in Gradio's queue is dropped by `cancels=` below
                    return H.progress_html(note="Cancelled before it started.")
                return H.progress_html(note="Nothing to cancel.")
            for job_id in job_ids:
                ctx.sup.cancel(job_id)
            deadline = time.monotonic() + 8
            st = ctx.sup.status(job_ids[-1])
            while not st.terminal and time.monotonic() < deadline:
                time.sleep(0.1)
                st = ctx.sup.status(job_ids[-1])
            return H.progress_html(st)

        cancel_btn.click(on_cancel, None, [progress], cancels=[gen_event], queue=False)

        # -- status line, history on load ------------------------------------
        def on_status():
            running, waiting = gpu_queue_counts(demo)
            if ctx.sup is not None:
                try:
                    waiting += ctx.sup.queue_length()   # jobs from other clients (CLI) too
                except Exception:  # noqa: BLE001 - status line only
                    pass
            note = ctx.sup_error or ("" if ctx.sup_ready.is_set() else "workers starting…")
            return H.status_line(ctx.capabilities(), ctx.segmenter_text, running, waiting, note)

        timer.tick(on_status, None, [status_md], show_progress="hidden", queue=False)

        def on_load(request: gr.Request):
            hist_md, hist_files = history(session_of(request))
            return on_status(), hist_md, hist_files

        demo.load(on_load, None, [status_md, history_md, history_files], queue=False)
    return demo

