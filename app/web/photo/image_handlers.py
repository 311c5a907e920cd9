"""The page's handlers for a tab's image and its selection: upload, clicks, box, undo and
clear, transparency as the mask, a mask file, and the image a loaded page takes over.

Each is ``handler(page, ctx, caller, *inputs) -> {component: value}`` (``app.web.page.wiring``
connects them): the tab's state is read and saved in ``ctx.sessions`` under
``caller.session``, the name the server derived from the browser cookie and the tab, never
kept in a ``gr.State`` (Gradio keys those by a session hash the client chooses, so another
client could read or change them). A component a handler leaves out stays as it is; a
handler that changes nothing says so for one component (``gr.skip()``), never with ``{}``,
which Gradio would take for a value.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Callable, Optional

import gradio as gr
import numpy as np

from app.web.server import usertext
from app.web.photo import selection
from app.web.page import status_line as statusview
from app.web.state import uploads
from app.web.server.context import AppContext
from app.web.page.layout import Page, Updates
from app.web.server.requestinfo import Caller, fault_reason
from kiln.limits import MIN_IMAGE_SIDE

# what each handler's action is called on the page, for the sentence a fault leaves
ACTIONS = {"on_upload": "The upload", "on_replace": "The upload", "on_upload_cleared": "Removing the image",
           "on_click": "The click", "on_find": "Find the object", "on_undo": "Undo",
           "on_clear": "Clear selection", "on_keep": "Add another object", "on_drop_kept": "Drop kept objects", "on_alpha": "Use transparency as mask",
           "on_show_mask": "Show selection", "on_box": "The box", "on_mask_file": "The mask file",
           "on_restore": "Taking over the image from before the reload"}


def selection_view(page: Page, st: uploads.SessionState) -> Updates:
    """The image with its selection drawn on it, the mask info, and the transparency box
    (offered only for an image that has transparency)."""
    return {page.canvas: selection.render_overlay(st), page.mask_info: selection.mask_summary(st),
            page.use_alpha: gr.update(visible=bool(st.image and st.image.has_alpha), value=st.use_alpha),
            page.drop_kept: gr.update(visible=bool(st.kept))}


def canvas_as_file(page: Page, ctx: AppContext, caller: Caller, answer: Updates) -> Updates:
    """What Gradio gets of an image handler's answer (``event_fn``'s ``present``): the
    canvas's pixels as a file only the caller's browser may fetch
    (``OwnedFiles.publish_canvas``). Given the array, Gradio would write it under a name made
    of its content alone, in the folder it serves to anyone who knows a path."""
    pixels = answer.get(page.canvas) if isinstance(answer, dict) else None
    if not isinstance(pixels, np.ndarray):
        return answer
    return {**answer, page.canvas: ctx.owned.publish_canvas(caller.session, pixels)}


def edit_selection(page: Page, ctx: AppContext, caller: Caller,
                   change: Callable[[uploads.SessionState], uploads.SessionState]) -> Updates:
    """Apply ``change(state) -> state`` to the tab's state and show the result; a change
    refused with a ``UIError`` leaves the state as it was and says why in a pop-up and under
    the image, where it stays until the next change."""
    refused = ""
    with ctx.sessions.edit(caller.session, caller.client) as (st, save):
        try:
            st = change(st)
            save(st)
        except usertext.UIError as e:
            refused = usertext.public_text(str(e))
            gr.Warning(refused)
    view = selection_view(page, st)
    if refused:
        view[page.mask_info] = f"{view[page.mask_info]}  \n⚠ {usertext.md_text(refused[:1].upper() + refused[1:])}."
    return view


def failed_view(page: Page, handler_name: str, e: BaseException) -> Updates:
    """What a fault no check foresaw leaves under the image (``event_fn``'s ``fallback``): a
    sentence naming the action and why, in a pop-up too, as a refusal does; the state is
    as the handler left it (``SessionStore.edit`` saves only what a handler saved)."""
    text = f"{ACTIONS.get(handler_name, 'This action')} failed: {fault_reason(e)}"
    gr.Warning(text)
    return {page.mask_info: f"⚠ **{usertext.md_text(text)}.** Try again, or another image; the server's log has the details."}


def on_upload(page: Page, ctx: AppContext, caller: Caller, path: Optional[str]) -> Updates:
    """A file dropped in the upload box (or an example picked). A refused file is taken out
    of the box, so the drop zone is back, and its reason stays under the image. A new image
    clears the last job's result (its text, the model in the viewer, the downloads: they
    belong to the old image; the history keeps them) unless this tab's job still runs, and
    the mask file."""
    fresh = cleared_result(page, ctx, caller)
    with ctx.sessions.edit(caller.session, caller.client) as (_, save):
        if not path:
            save(uploads.SessionState())
            return {**selection_view(page, uploads.SessionState()), **fresh, page.mask_file: None}
        try:
            ctx.sessions.admit(caller.session, caller.client, Path(path).stat().st_size)
            with ctx.decodes:   # a 40 MP decode takes ~160 MB for a moment
                st = uploads.load_upload(path, ctx.settings.app, name=Path(path).name)
            save(st)
        except (usertext.UIError, OSError) as e:
            text = usertext.public_text(str(e))
            gr.Warning(text)
            save(uploads.SessionState())
            return {page.canvas: None, page.mask_info: f"**Cannot use this file:** {html.escape(text)}",
                    page.use_alpha: gr.update(visible=False, value=False), page.upload: None,
                    **fresh, page.mask_file: None}
    selection.prepare_segmenter(st, ctx.segmenter)
    return {**selection_view(page, st), **fresh, page.mask_file: None, **upload_label(page)}


def on_replace(page: Page, ctx: AppContext, caller: Caller, path: Optional[str]) -> Updates:
    """A file dropped on the upload box while it holds an image, or chosen after a click on
    it (``pageassets.REPLACE_JS`` hands it to the hidden ``replace`` box): an upload like
    any other, then shown in the upload box in place of the old one; the hidden box is
    emptied for the next file. A refused file leaves both boxes empty, as a refused drop
    on the empty box does."""
    if not path:
        return {page.replace: gr.skip()}
    answer = on_upload(page, ctx, caller, path)
    if answer.get(page.upload) is not None:
        # the file is in Gradio's upload folder already: shown from there, not copied
        answer[page.upload] = gr.update(value=path, label=page.upload.label)
    return {**answer, page.replace: None}


def cleared_result(page: Page, ctx: AppContext, caller: Caller) -> Updates:
    """The last job's result taken off the page (none while the tab's job runs: it lands here)."""
    if ctx.active.busy(caller.session):
        return {}
    return {page.progress: statusview.progress_html(), page.model: None,
            page.glb_download: gr.update(visible=False), page.ply_download: gr.update(visible=False),
            page.more_files: gr.update(value=None, visible=False), page.file_sizes: ""}


def on_upload_cleared(page: Page, ctx: AppContext, caller: Caller) -> Updates:
    """The person removed the image: it is freed, and not brought back by a reload; the last
    result, which was of that image, goes from the page too."""
    ctx.sessions.drop(caller.session)
    return {**selection_view(page, uploads.SessionState()), **cleared_result(page, ctx, caller),
            **upload_label(page)}


def on_click(page: Page, ctx: AppContext, caller: Caller, background: bool, evt: gr.SelectData) -> Updates:
    """A click on the image (``evt.index``: [x, y] in the shown image's pixels) adds an
    object click, or a background click when "Background clicks" is on."""
    x, y = float(evt.index[0]), float(evt.index[1])
    return edit_selection(page, ctx, caller,
                          lambda st: selection.add_click(st, x, y, bool(background), ctx.segmenter))


def on_find(page: Page, ctx: AppContext, caller: Caller) -> Updates:
    """"Find the object": the object found without clicks becomes the selection (a photo
    without transparency; SAM 2, rembg or the border model, as ``app.auto_mask`` and what
    is installed say); when none can be told, a pop-up says why and what to do."""
    return edit_selection(page, ctx, caller, lambda st: selection.find_automatically(_findable(st), ctx.finder))


def _findable(st: uploads.SessionState) -> uploads.SessionState:
    """``st`` when "Find the object" can run on its working copy (the image it looks at,
    at most ``SEG_MAX_SIDE`` a side: a 20000x100 photo is a 1024x5 copy), else a UIError
    saying why and what to do instead."""
    img = uploads.require_image(st)
    h, w = img.work.shape[:2]
    if min(h, w) < MIN_IMAGE_SIDE:
        H, W = img.size
        raise usertext.UIError(
            f"Find the object looks at a {w}x{h} copy of this {W}x{H} image, too thin to find an object in "
            f"(it needs {MIN_IMAGE_SIDE} pixels a side); crop the image nearer the object, or drag a box around it")
    return st


def on_undo(page: Page, ctx: AppContext, caller: Caller) -> Updates:
    return edit_selection(page, ctx, caller, lambda st: selection.undo_click(st, ctx.segmenter))


def on_clear(page: Page, ctx: AppContext, caller: Caller) -> Updates:
    return edit_selection(page, ctx, caller, selection.clear_clicks)


def on_alpha(page: Page, ctx: AppContext, caller: Caller, on: bool) -> Updates:
    return edit_selection(page, ctx, caller, lambda st: uploads.set_use_alpha(st, bool(on)))


def on_show_mask(page: Page, ctx: AppContext, caller: Caller, on: bool) -> Updates:
    return edit_selection(page, ctx, caller, lambda st: uploads.set_show_mask(st, bool(on)))


def on_box(page: Page, ctx: AppContext, caller: Caller, text: str) -> Updates:
    """A box dragged on the image: "x0,y0,x1,y1" from the drag script (``BOX_JS``);
    anything else changes nothing."""
    try:
        x0, y0, x1, y1 = (float(v) for v in str(text).split(","))
    except ValueError:
        return {page.canvas: gr.skip()}
    return edit_selection(page, ctx, caller, lambda st: selection.set_box(st, x0, y0, x1, y1, ctx.segmenter))


def on_mask_file(page: Page, ctx: AppContext, caller: Caller, path: Optional[str]) -> Updates:
    """A mask file given (or removed: back to clicks). A refused file leaves the box empty
    and says why under the image."""
    if not path:
        return edit_selection(page, ctx, caller, selection.clear_clicks)
    with ctx.sessions.edit(caller.session, caller.client) as (st, save):
        try:
            with ctx.decodes:   # the mask file is decoded at full size
                st = uploads.set_mask_file(st, path, ctx.settings.app, name=Path(path).name)
            save(st)
        except usertext.UIError as e:
            text = usertext.public_text(str(e))
            gr.Warning(text)
            return {**selection_view(page, st),
                    page.mask_info: f"**Cannot use this mask:** {html.escape(text)}", page.mask_file: None}
    return selection_view(page, st)


def on_restore(page: Page, ctx: AppContext, caller: Caller) -> Updates:
    """A page loaded: a reload (or a new tab) takes over the browser's newest image, clicks
    and mask (``SessionStore.adopt``)."""
    st = ctx.sessions.adopt(caller.session, caller.client)
    if st.image is None:
        return {page.canvas: gr.skip()}
    # the upload box names the image the canvas shows (serving the file into it again would
    # copy up to the upload limit on every reload)
    restored = f"Image: {st.image.name}, from before the reload (drop another file here to replace it)"
    return {**selection_view(page, st), page.show_mask: gr.update(value=st.show_mask),
            page.upload: gr.update(label=restored)}


def upload_label(page: Page) -> Updates:
    """The upload box's own label again (after a reload had it name the restored image)."""
    return {page.upload: gr.update(label=page.upload.label)}


def prepare_restored(ctx: AppContext, caller: Caller) -> None:
    """After ``on_restore``: start the segmenter's work on the image taken over (SAM2
    computes its embedding), so the first click is quick."""
    selection.prepare_segmenter(ctx.sessions.get(caller.session), ctx.segmenter)



def on_keep(page: Page, ctx: AppContext, caller: Caller) -> Updates:
    """"Add another object": the selection kept as the next object of the photo and a new
    selection started (``app.web.photo.objects``); the mask info lists the kept ones and says
    what Generate will make of them with this server's reconstruction."""
    from app.web.photo.objects import generate_note, keep_object

    view = edit_selection(page, ctx, caller, keep_object)
    count = len(ctx.sessions.get(caller.session).kept) + 1
    note = generate_note(ctx.settings.reconstruct.backend, count)
    if note:
        view[page.mask_info] = f"{view[page.mask_info]}  \n{usertext.md_text(note[:1].upper() + note[1:])}."
    return view


def on_drop_kept(page: Page, ctx: AppContext, caller: Caller) -> Updates:
    """"Drop kept objects": back to one object, the current selection."""
    from app.web.photo.objects import drop_kept

    return edit_selection(page, ctx, caller, drop_kept)
