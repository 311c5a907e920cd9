"""The page as data: ``layout(settings, examples) -> Page`` builds every component in one
place and hands them back by name. It connects no events (``app.wiring`` does), so the
handlers (``app.handlers_*``) can name their outputs by these fields and their tests can
build a page without serving it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import gradio as gr

from kiln.settings import Settings, allowed_range, allowed_values

from . import history, selection, statusview, uploads
from .example_images import EXAMPLES

# What a handler answers: {component of the Page: its new value or a gr.update(...)}
Updates = dict


@dataclass(frozen=True, eq=False)
class Page:
    """The page's components. ``form`` lists the settings boxes in ``form.ui_overrides``'
    order; ``selection_view`` what shows the tab's image and selection; ``examples`` is
    None when the page has none."""

    demo: gr.Blocks
    status: gr.Markdown
    # the image and its selection (left column)
    upload: gr.File
    canvas: gr.Image
    mask_info: gr.Markdown
    background: gr.Checkbox
    show_mask: gr.Checkbox
    use_alpha: gr.Checkbox
    undo: gr.Button
    clear: gr.Button
    mask_file: gr.File
    box_input: gr.Textbox
    box_button: gr.Button
    examples: Optional[gr.helpers.Examples]
    # the settings (right column)
    bake: gr.Checkbox
    ply: gr.Checkbox
    texture: gr.Dropdown
    mode: gr.Radio
    views: gr.Slider
    simplify: gr.Slider
    seed: gr.Number
    # the job and its result
    generate: gr.Button
    cancel: gr.Button
    progress: gr.HTML
    model: gr.Model3D
    glb_download: gr.DownloadButton
    ply_download: gr.DownloadButton
    history: gr.HTML
    history_files: gr.File
    timer: gr.Timer

    @property
    def form(self) -> list:
        return [self.bake, self.simplify, self.texture, self.views, self.mode, self.seed, self.ply]

    @property
    def selection_view(self) -> list:
        return [self.canvas, self.mask_info, self.use_alpha]


def layout(settings: Settings, examples: Optional[list[Path]] = None) -> Page:
    """Build the page's components inside a new ``gr.Blocks`` (``Page.demo``); widget
    limits and defaults come from ``settings`` and the settings' own ranges."""
    from kiln.imageio import describe_limits, upload_limit_bytes

    s = settings
    upload_limits = describe_limits(s.app.max_pixels, upload_limit_bytes(s.app.max_pixels, s.app.max_upload_mb))
    c: dict = {}
    # every click writes an overlay JPEG into Gradio's folder: sweep hourly, keep a day
    with gr.Blocks(title="Kiln — photo to 3D", delete_cache=(3600, 86400)) as demo:
        gr.Markdown("# Kiln\nUpload a photo, click the object, press **Generate** to get a textured 3D model (GLB).")
        c["status"] = gr.Markdown(elem_id="kiln-status")
        with gr.Row(equal_height=False):
            with gr.Column(scale=1):
                _image_column(c, upload_limits, examples)
            with gr.Column(scale=1):
                _settings_and_result_column(c, s)
        c["timer"] = gr.Timer(2.0)
    return Page(demo=demo, **c)


def _image_column(c: dict, upload_limits: str, examples: Optional[list[Path]]) -> None:
    c["upload"] = gr.File(label=f"Image (PNG, JPEG, WebP, TIFF…; {upload_limits})", file_types=["image"],
                          file_count="single", type="filepath", elem_id="kiln-upload", height=110)
    c["canvas"] = gr.Image(label="Click the object or drag a box around it (green = object, red = background)",
                           interactive=False, type="numpy", format="jpeg", elem_id="kiln-canvas",
                           buttons=["fullscreen"], height=460)
    c["mask_info"] = gr.Markdown(selection.mask_summary(uploads.SessionState()), elem_id="kiln-mask-info")
    with gr.Row():
        c["background"] = gr.Checkbox(label="Background clicks", value=False, elem_id="kiln-bg")
        c["show_mask"] = gr.Checkbox(label="Show selection", value=True, elem_id="kiln-show-mask",
                                     info="off: the photo alone")
        c["use_alpha"] = gr.Checkbox(label="Use transparency as mask", value=False, visible=False,
                                     elem_id="kiln-alpha")
    with gr.Row():
        c["undo"] = gr.Button("Undo", size="sm", elem_id="kiln-undo")
        c["clear"] = gr.Button("Clear selection", size="sm", elem_id="kiln-clear")
    c["mask_file"] = gr.File(label="Or a mask file (same size as the image; alpha or white = object)",
                             file_types=["image"], file_count="single", type="filepath",
                             elem_id="kiln-mask-file", height=90)
    # the drag-a-box script (pageassets.BOX_JS) writes "x0,y0,x1,y1" here and presses the button
    c["box_input"] = gr.Textbox(elem_id="kiln-box-input", elem_classes=["kiln-hidden"],
                                show_label=False, container=False)
    c["box_button"] = gr.Button("box", elem_id="kiln-box-btn", elem_classes=["kiln-hidden"])
    # made here, shown in the right column (.render() there): an example's upload resets it
    c["progress"] = gr.HTML(statusview.progress_html(), elem_id="kiln-progress-box", render=False)
    c["examples"] = None
    if examples:
        captions = dict(EXAMPLES)
        # the upload handler runs after an example fills the upload box (app.wiring)
        c["examples"] = gr.Examples(
            examples=[[str(p)] for p in examples], inputs=[c["upload"]], cache_examples=False,
            example_labels=[f"{p.name}: {captions[p.name]}" if p.name in captions else p.name
                            for p in examples],
            label="Examples (generated by Kiln)")


def _settings_and_result_column(c: dict, s: Settings) -> None:
    with gr.Accordion("Settings", open=True):
        with gr.Row():
            c["bake"] = gr.Checkbox(label="Bake texture", value=s.bake.enabled, elem_id="kiln-bake",
                                    info="off: vertex colours, faster")
            c["ply"] = gr.Checkbox(label="Also export Gaussians (.ply)", value=s.export.gaussians_ply,
                                   elem_id="kiln-ply")
        with gr.Row():
            # widget limits come from the settings' own ranges (one source)
            c["texture"] = gr.Dropdown(label="Texture size", choices=["auto"] + list(allowed_values("bake.texture_size")),
                                       value=s.bake.texture_size, elem_id="kiln-texture",
                                       interactive=s.bake.enabled)
            c["mode"] = gr.Radio(label="Bake mode", choices=list(allowed_values("bake.mode")),
                                 value=s.bake.mode, elem_id="kiln-mode",
                                 info="fast: back-projection; opt: optimised", interactive=s.bake.enabled)
        views_lo, views_hi = allowed_range("views.count")
        c["views"] = gr.Slider(label="Bake views", minimum=views_lo, maximum=views_hi, step=1,
                               value=s.views.count, elem_id="kiln-views")
        ratio_lo, ratio_hi = allowed_range("mesh.simplify_ratio")
        c["simplify"] = gr.Slider(label="Simplify ratio (fraction of faces removed)", minimum=ratio_lo,
                                  maximum=ratio_hi, step=0.005, value=s.mesh.simplify_ratio,
                                  elem_id="kiln-simplify")
        # no minimum here: Gradio's own refusal would not name the box; form.job_settings does
        c["seed"] = gr.Number(label="Seed", value=s.seed, precision=0, elem_id="kiln-seed")
    with gr.Row():
        c["generate"] = gr.Button("Generate", variant="primary", elem_id="kiln-generate")
        c["cancel"] = gr.Button("Cancel", variant="stop", elem_id="kiln-cancel", interactive=False)
    c["progress"].render()
    c["model"] = gr.Model3D(label="Result", elem_id="kiln-model", height=420, clear_color=(0.93, 0.93, 0.95, 1.0))
    with gr.Row():
        c["glb_download"] = gr.DownloadButton("Download GLB", visible=False, elem_id="kiln-dl-glb")
        c["ply_download"] = gr.DownloadButton("Download Gaussians (.ply)", visible=False, elem_id="kiln-dl-ply")
    with gr.Accordion("History (this browser)", open=False):
        c["history"] = gr.HTML(history.history_html([]), elem_id="kiln-history")
        c["history_files"] = gr.File(label="Earlier results", file_count="multiple", interactive=False,
                                     elem_id="kiln-history-files")
