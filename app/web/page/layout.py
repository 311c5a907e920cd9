"""The page as data: ``layout(settings, examples) -> Page`` builds every component in one
place and hands them back by name. It connects no events (``app.web.page.wiring`` does), so the
handlers (``app.handlers_*``) can name their outputs by these fields and their tests can
build a page without serving it."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Optional

import gradio as gr

from kiln.settings import Settings, allowed_range, allowed_values

from app.web.bake.bake_form import MORE_OBJECTS, MORE_PHOTOS, BakeForm, FitForm
from app.web.photo.form import GenerateForm
from app.web.state import history
from app.web.server.file_refs import CheckedBlocks
from app.web.photo import selection
from app.web.page import status_line as statusview
from app.web.state import uploads
from app.web.page.example_images import EXAMPLES

# What a handler answers: {component of the Page: its new value or a gr.update(...)}
Updates = dict


BAKE_PROGRESS_ID = "kiln-bake-progress"
# the bake tab's first step: the photo's camera fitted before anything is baked
FIT_LABEL = "Fit the camera to the photo"


@dataclass(frozen=True, eq=False)
class BakeTab:
    """The "Bake a model" tab: a mesh someone made, with what to colour it from.
    ``form`` lists Bake's inputs as ``app.web.bake.bake_form.BakeForm`` has them, ``fit_form``
    those of "Fit the camera to the photo" (``fit_button``, ``app.web.bake.fit_handlers``), whose
    picture shows in ``fit_view`` and its figures in ``fit_info``."""

    mesh: gr.File
    splat: gr.File
    photo: gr.File
    mask: gr.File
    reuse: gr.Checkbox
    source: gr.Dropdown
    camera: gr.File
    focal: gr.Number
    photo_2: gr.File
    mask_2: gr.File
    camera_2: gr.File
    photo_3: gr.File
    mask_3: gr.File
    camera_3: gr.File
    photo_4: gr.File
    mask_4: gr.File
    camera_4: gr.File
    frame: gr.Radio
    fit: gr.Checkbox
    uvs: gr.Radio
    texture: gr.Dropdown
    simplify: gr.Slider
    formats: gr.CheckboxGroup
    texture_format: gr.Radio
    units: gr.Radio
    faces: gr.Number
    object_mesh_2: gr.File
    object_splat_2: gr.File
    object_mask_2: gr.File
    object_mesh_3: gr.File
    object_splat_3: gr.File
    object_mask_3: gr.File
    fit_button: gr.Button
    bake_button: gr.Button
    cancel: gr.Button
    progress: gr.HTML
    notes: gr.Markdown
    fit_view: gr.Image
    fit_info: gr.Markdown
    model: gr.Model3D
    download: gr.DownloadButton
    more_files: gr.File
    file_sizes: gr.Markdown

    @property
    def form(self) -> list:
        """Bake's inputs, in ``BakeForm``'s field order (the record the handlers get)."""
        return [getattr(self, f.name) for f in fields(BakeForm)]

    @property
    def fit_form(self) -> list:
        """The fit's inputs, in ``FitForm``'s field order."""
        return [getattr(self, f.name) for f in fields(FitForm)]

    @property
    def fit_depends_on(self) -> list:
        """What a fitted camera holds for: changing any of these drops it."""
        return [self.mesh, self.splat, self.photo, self.mask, self.reuse, self.source, self.camera, self.focal,
                self.frame, *(getattr(self, f"{what}_{n}") for n in range(2, 2 + MORE_PHOTOS)
                              for what in ("photo", "mask", "camera"))]


@dataclass(frozen=True, eq=False)
class Page:
    """The page's components. ``form`` lists the settings boxes as
    ``app.web.photo.form.GenerateForm`` has them; ``selection_view`` what shows the tab's image and selection; ``examples`` is
    None when the page has none. ``replace`` is a hidden file box: the page's script
    (``pageassets.REPLACE_JS``) hands it a file dropped on, or chosen by clicking, the upload
    box while that holds an image, so the file replaces the image."""

    demo: gr.Blocks
    status: gr.Markdown
    # the image and its selection (left column)
    upload: gr.File
    replace: gr.File
    canvas: gr.Image
    mask_info: gr.Markdown
    background: gr.Checkbox
    show_mask: gr.Checkbox
    use_alpha: gr.Checkbox
    find: gr.Button
    undo: gr.Button
    clear: gr.Button
    keep: gr.Button
    drop_kept: gr.Button
    mask_file: gr.File
    box_input: gr.Textbox
    box_button: gr.Button
    examples: Optional[gr.helpers.Examples]
    # the settings (right column, under the result)
    bake_texture: gr.Checkbox
    ply: gr.Checkbox
    texture: gr.Dropdown
    mode: gr.Radio
    views: gr.Slider
    simplify: gr.Slider
    faces: gr.Number
    seed: gr.Number
    formats: gr.CheckboxGroup
    texture_format: gr.Radio
    units: gr.Radio
    # the job and its result (right column, at its top)
    generate: gr.Button
    cancel: gr.Button
    progress: gr.HTML
    model: gr.Model3D
    glb_download: gr.DownloadButton
    ply_download: gr.DownloadButton
    more_files: gr.File
    file_sizes: gr.Markdown
    history: gr.HTML
    history_files: gr.File
    history_pick: gr.Textbox
    history_button: gr.Button
    timer: gr.Timer
    bake_tab: BakeTab

    @property
    def form(self) -> list:
        """The settings boxes, in ``GenerateForm``'s field order (the record the handlers get)."""
        return [getattr(self, f.name) for f in fields(GenerateForm)]

    @property
    def selection_view(self) -> list:
        return [self.canvas, self.mask_info, self.use_alpha, self.drop_kept]


def layout(settings: Settings, examples: Optional[list[Path]] = None) -> Page:
    """Build the page's components inside a new ``gr.Blocks`` (``Page.demo``); widget
    limits and defaults come from ``settings`` and the settings' own ranges."""
    from kiln.imageio import describe_limits, upload_limit_bytes

    s = settings
    upload_limits = describe_limits(s.app.max_pixels, upload_limit_bytes(s.app.max_pixels, s.app.max_upload_mb))
    c: dict = {}
    # every click writes an overlay JPEG into Gradio's folder: sweep hourly, keep a day
    with CheckedBlocks(title="Kiln — photo to 3D", delete_cache=(3600, 86400)) as demo:
        gr.Markdown("# Kiln\nUpload a photo, click the object, press **Generate** to get a textured 3D model (GLB).")
        c["status"] = gr.Markdown(elem_id="kiln-status")
        with gr.Tabs():
            with gr.Tab("Photo to 3D", elem_id="kiln-tab-photo"):
                # on a phone the stylesheet puts the result column's top (Generate, the
                # result) before the image column's tail (mask file, examples): pageassets.CSS
                with gr.Row(equal_height=False, elem_id="kiln-photo-row"):
                    with gr.Column(scale=1, elem_id="kiln-image-col"):
                        _image_column(c, upload_limits, examples)
                    with gr.Column(scale=1, elem_id="kiln-job-col"):
                        _job_column(c)
                        _settings(c, s)
                        _history(c)
            with gr.Tab("Bake a model", elem_id="kiln-tab-bake"):
                c["bake_tab"] = _bake_tab(s)
        c["timer"] = gr.Timer(2.0)
        # Gradio's own "Use via API" footer is off (the page's events are private): say where
        # the script endpoints are described
        gr.Markdown("Scripts can use this server too, with `gradio_client`: the endpoints are described in "
                    "`docs/api.md` in Kiln's folder (`examples/api_client.py` is a client to start from).",
                    elem_id="kiln-api-note")
    return Page(demo=demo, **c)


def _image_column(c: dict, upload_limits: str, examples: Optional[list[Path]]) -> None:
    # "kiln-drop": a drop zone whose label takes its own line and whose text is never cut
    c["upload"] = gr.File(label=f"Image (PNG, JPEG, WebP, TIFF…; {upload_limits})", file_types=["image"],
                          file_count="single", type="filepath", elem_id="kiln-upload", height=110,
                          elem_classes=["kiln-drop"])
    c["replace"] = gr.File(file_types=["image"], file_count="single", type="filepath", show_label=False,
                           elem_id="kiln-upload-replace", elem_classes=["kiln-hidden"])
    # the alt text names the button Gradio wraps around the image (it had no accessible name)
    c["canvas"] = gr.Image(label="Click the object or drag a box around it (green = object, red = background)",
                           interactive=False, type="numpy", format="jpeg", elem_id="kiln-canvas",
                           buttons=["fullscreen"], height=460,
                           alt_text="The image and its selection: click the object, or drag a box around it")
    c["mask_info"] = gr.Markdown(selection.mask_summary(uploads.SessionState()), elem_id="kiln-mask-info")
    with gr.Row(elem_id="kiln-view-options"):
        c["background"] = gr.Checkbox(label="Background clicks", value=False, elem_id="kiln-bg")
        c["show_mask"] = gr.Checkbox(label="Show selection", value=True, elem_id="kiln-show-mask",
                                     info="off: the photo alone")
        c["use_alpha"] = gr.Checkbox(label="Use transparency as mask", value=False, visible=False,
                                     elem_id="kiln-alpha")
    # narrow minimums: the three stay on one line on a phone
    with gr.Row(elem_id="kiln-selection-buttons"):
        c["find"] = gr.Button("Find the object", size="sm", elem_id="kiln-find", min_width=60)
        c["undo"] = gr.Button("Undo", size="sm", elem_id="kiln-undo", min_width=60)
        c["clear"] = gr.Button("Clear selection", size="sm", elem_id="kiln-clear", min_width=60)
    # several objects of one photo (app.web.photo.objects): the selection kept, a new one started
    with gr.Row(elem_id="kiln-object-buttons"):
        c["keep"] = gr.Button("Add another object", size="sm", elem_id="kiln-keep", min_width=60)
        c["drop_kept"] = gr.Button("Drop kept objects", size="sm", elem_id="kiln-drop-kept", min_width=60,
                                   visible=False)
    # the drag-a-box script (pageassets.BOX_JS) writes "x0,y0,x1,y1" here and presses the button
    c["box_input"] = gr.Textbox(elem_id="kiln-box-input", elem_classes=["kiln-hidden"],
                                show_label=False, container=False)
    c["box_button"] = gr.Button("box", elem_id="kiln-box-btn", elem_classes=["kiln-hidden"])
    # made here, shown in the right column (.render() there): an example's upload resets it
    c["progress"] = gr.HTML(statusview.progress_html(), elem_id="kiln-progress-box", render=False)
    with gr.Column(elem_id="kiln-image-more"):
        c["mask_file"] = gr.File(label="Or a mask file (same size as the image; alpha or white = object)",
                                 file_types=["image"], file_count="single", type="filepath",
                                 elem_id="kiln-mask-file", height=90, elem_classes=["kiln-drop"])
    # a column of its own: on a phone with no image yet the stylesheet lifts it under the
    # upload box, where "pick an example below" sends the eye (pageassets.CSS)
    c["examples"] = None
    with gr.Column(elem_id="kiln-examples"):
        if examples:
            captions = dict(EXAMPLES)
            # the upload handler runs after an example fills the upload box (app.web.page.wiring)
            c["examples"] = gr.Examples(
                examples=[[str(p)] for p in examples], inputs=[c["upload"]], cache_examples=False,
                example_labels=[f"{p.name}: {captions[p.name]}" if p.name in captions else p.name
                                for p in examples],
                label="Examples (generated by Kiln)")


def _job_column(c: dict) -> None:
    """Generate, the progress and the result, at the top of the right column: the viewer is
    on screen with the image beside it (1400x1000), and on a phone right after the image."""
    with gr.Row(elem_id="kiln-job-buttons"):
        # side by side on a phone too
        c["generate"] = gr.Button("Generate", variant="primary", elem_id="kiln-generate", min_width=100)
        c["cancel"] = gr.Button("Cancel", variant="stop", elem_id="kiln-cancel", interactive=False, min_width=100)
    c["progress"].render()
    c["model"] = gr.Model3D(label="Result", elem_id="kiln-model", height=420, clear_color=(0.93, 0.93, 0.95, 1.0))
    with gr.Row(elem_id="kiln-downloads"):
        c["glb_download"] = gr.DownloadButton("Download GLB", visible=False, elem_id="kiln-dl-glb")
        c["ply_download"] = gr.DownloadButton("Download Gaussians (.ply)", visible=False, elem_id="kiln-dl-ply")
    result_files(c, "kiln")


def _settings(c: dict, s: Settings) -> None:
    with gr.Accordion("Settings", open=True, elem_id="kiln-settings"):
        with gr.Row():
            c["bake_texture"] = gr.Checkbox(label="Bake texture", value=s.bake.enabled, elem_id="kiln-bake",
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
                               value=s.views.count, elem_id="kiln-views", interactive=s.bake.enabled)
        ratio_lo, ratio_hi = allowed_range("mesh.simplify_ratio")
        c["simplify"] = gr.Slider(label="Simplify ratio (fraction of faces removed)", minimum=ratio_lo,
                                  maximum=ratio_hi, step=0.005, value=s.mesh.simplify_ratio,
                                  elem_id="kiln-simplify")
        c["faces"] = gr.Number(label="Faces (an exact count instead of the ratio; 0 uses the ratio)",
                               value=s.mesh.faces, precision=0, elem_id="kiln-faces")
        # no minimum here: Gradio's own refusal would not name the box; form.job_settings does
        c["seed"] = gr.Number(label="Seed", value=s.seed, precision=0, elem_id="kiln-seed")
        format_widgets(c, s, "kiln")


def _history(c: dict) -> None:
    with gr.Accordion("History (this browser)", open=False, elem_id="kiln-history-box"):
        c["history"] = gr.HTML(history.history_html([]), elem_id="kiln-history")
        # Gradio's file list puts a "×" beside each file: it only takes the file off this list
        c["history_files"] = gr.File(label="Earlier results' files (× hides one from this list until the page "
                                           "reloads; the file stays)", file_count="multiple", interactive=False,
                                     elem_id="kiln-history-files")
        # a click on a row of the history (pageassets.HISTORY_JS) writes its job id here and
        # presses the button: the row's model shows in the viewer
        c["history_pick"] = gr.Textbox(elem_id="kiln-history-pick", elem_classes=["kiln-hidden"],
                                       show_label=False, container=False)
        c["history_button"] = gr.Button("show", elem_id="kiln-history-btn", elem_classes=["kiln-hidden"])


def _bake_tab(s: Settings) -> BakeTab:
    """A mesh from SAM 3D, TRELLIS, 3DGS or Kiln, textured from its splat, its photo or its own
    colours (``kiln bake`` on the page)."""
    from kiln.bakerequest import CAMERA_FRAMES, SOURCES

    c: dict = {}
    gr.Markdown("Texture a mesh you already have. Each texel takes its colour from the photo (where its "
                "camera sees the surface inside the mask), else the splat, else the mesh's own colours. "
                f"Without the photo's camera, press **{FIT_LABEL}** first to see how the model lines up "
                "with the photo; **Bake** then uses that camera.")
    with gr.Row(equal_height=False):
        with gr.Column(scale=1):
            c["mesh"] = gr.File(label="Mesh (GLB, glTF, OBJ, PLY, STL)", file_count="single", type="filepath",
                                file_types=[".glb", ".gltf", ".obj", ".ply", ".stl"], elem_id="kiln-bake-mesh",
                                elem_classes=["kiln-drop"], height=90)
            c["splat"] = gr.File(label="Its splat (3DGS .ply), optional", file_count="single", type="filepath",
                                 file_types=[".ply"], elem_id="kiln-bake-splat", elem_classes=["kiln-drop"],
                                 height=90)
            c["source"] = gr.Dropdown(label="The splat comes from", choices=list(SOURCES), value="auto",
                                      elem_id="kiln-bake-source",
                                      info="auto: found from where the splat lies on the mesh")
            with gr.Accordion("The photo (optional)", open=True):
                c["reuse"] = gr.Checkbox(label="Use the photo and selection of the first tab", value=False,
                                         elem_id="kiln-bake-reuse")
                with gr.Row():
                    c["photo"] = gr.File(label="Or a photo", file_count="single", type="filepath",
                                         file_types=["image"], elem_id="kiln-bake-photo",
                                         elem_classes=["kiln-drop"], height=90)
                    c["mask"] = gr.File(label="and its mask (white = object; default: its transparency)",
                                        file_count="single", type="filepath", file_types=["image"],
                                        elem_id="kiln-bake-mask", elem_classes=["kiln-drop"], height=90)
                c["camera"] = gr.File(label="Its camera (JSON: the source_camera of kiln run --report)",
                                      file_count="single", type="filepath", file_types=[".json"],
                                      elem_id="kiln-bake-camera", elem_classes=["kiln-drop"], height=90)
                with gr.Row():
                    c["focal"] = gr.Number(label="Or its focal length in pixels (0: none)", value=0,
                                           minimum=0, elem_id="kiln-bake-focal")
                    c["frame"] = gr.Radio(label="Mesh in the camera frame of", choices=list(CAMERA_FRAMES),
                                          value="opengl", elem_id="kiln-bake-frame")
                c["fit"] = gr.Checkbox(label="Fit the camera during the bake (also when no camera is given)",
                                       value=False, elem_id="kiln-bake-fit",
                                       info=f"its silhouette over the photo shows as soon as it is fitted, "
                                            f"before the texture is baked: cancel if it is wrong. "
                                            f"Or fit it first ({FIT_LABEL}): Bake then uses that camera")
            with gr.Accordion("More photos of the object (optional)", open=False, elem_id="kiln-bake-more"):
                gr.Markdown("Each texel takes the photo that sees it best; exposure differences are levelled. "
                            "A photo without a camera gets one fitted.")
                for n in range(2, 2 + MORE_PHOTOS):
                    with gr.Row():
                        c[f"photo_{n}"] = gr.File(label=f"Photo {n}", file_count="single", type="filepath",
                                                  file_types=["image"], elem_id=f"kiln-bake-photo-{n}",
                                                  elem_classes=["kiln-drop"], height=90)
                        c[f"mask_{n}"] = gr.File(label="its mask", file_count="single", type="filepath",
                                                 file_types=["image"], elem_id=f"kiln-bake-mask-{n}",
                                                 elem_classes=["kiln-drop"], height=90)
                        c[f"camera_{n}"] = gr.File(label="its camera (JSON)", file_count="single",
                                                   type="filepath", file_types=[".json"],
                                                   elem_id=f"kiln-bake-camera-{n}", elem_classes=["kiln-drop"],
                                                   height=90)
            with gr.Accordion("More objects of this photo: a scene (optional)", open=False,
                              elem_id="kiln-bake-objects"):
                gr.Markdown("Several objects of the one photo (SAM 3D Objects, SAM 3D Body), each with its own "
                            "mask, baked into one GLB with a node per object, in the photo's camera frame. The "
                            "mesh, splat and mask above are the first object; the photo and its camera are "
                            "shared. An object whose pose does not fit the camera is fitted under it; a part "
                            "another object hides takes none of its colours.")
                for n in range(2, 2 + MORE_OBJECTS):
                    with gr.Row():
                        c[f"object_mesh_{n}"] = gr.File(label=f"Object {n}: mesh", file_count="single",
                                                        type="filepath",
                                                        file_types=[".glb", ".gltf", ".obj", ".ply", ".stl"],
                                                        elem_id=f"kiln-bake-object-mesh-{n}",
                                                        elem_classes=["kiln-drop"], height=90)
                        c[f"object_splat_{n}"] = gr.File(label="its splat (optional)", file_count="single",
                                                         type="filepath", file_types=[".ply"],
                                                         elem_id=f"kiln-bake-object-splat-{n}",
                                                         elem_classes=["kiln-drop"], height=90)
                        c[f"object_mask_{n}"] = gr.File(label="its mask in the photo", file_count="single",
                                                        type="filepath", file_types=["image"],
                                                        elem_id=f"kiln-bake-object-mask-{n}",
                                                        elem_classes=["kiln-drop"], height=90)
        with gr.Column(scale=1):
            with gr.Row():
                c["uvs"] = gr.Radio(label="UVs", choices=["auto", "keep", "new"], value="auto",
                                    elem_id="kiln-bake-uvs", info="keep: the mesh's own; auto: its own when usable")
                # starts at the configured bake.texture_size, as `kiln bake` does; this box offers
                # sizes only, so a configured "auto" starts it at 1024
                size = s.bake.texture_size if s.bake.texture_size != "auto" else 1024
                c["texture"] = gr.Dropdown(label="Texture size", choices=list(allowed_values("bake.texture_size")),
                                           value=size, elem_id="kiln-bake-texture")
            ratio_lo, ratio_hi = allowed_range("mesh.simplify_ratio")
            c["simplify"] = gr.Slider(label="Simplify ratio (new UVs; 0 keeps every face)", minimum=ratio_lo,
                                      maximum=ratio_hi, step=0.005, value=0.0, elem_id="kiln-bake-simplify")
            c["faces"] = gr.Number(label="Faces (new UVs: an exact count instead of the ratio; 0 uses the ratio)",
                                   value=0, precision=0, elem_id="kiln-bake-faces")
            format_widgets(c, s, "kiln-bake")
            with gr.Row():
                # the step before baking: the photo's camera alone (app.web.bake.fit_handlers)
                c["fit_button"] = gr.Button(FIT_LABEL, variant="secondary", elem_id="kiln-bake-fit-button")
                c["bake_button"] = gr.Button("Bake", variant="primary", elem_id="kiln-bake-button")
                c["cancel"] = gr.Button("Cancel", variant="stop", elem_id="kiln-bake-cancel", interactive=False)
            c["progress"] = gr.HTML(statusview.progress_html(dom_id=BAKE_PROGRESS_ID), elem_id="kiln-bake-progress-box")
            c["notes"] = gr.Markdown("", elem_id="kiln-bake-notes")
            c["fit_view"] = gr.Image(label="The fitted camera: the model's silhouette (blue, orange outline) over "
                                           "the photo; the mask's outline green (a scene: each object's silhouette "
                                           "and mask in a colour of its own)", visible=False, interactive=False,
                                     elem_id="kiln-bake-fit-view")
            c["fit_info"] = gr.Markdown("", elem_id="kiln-bake-fit-info")
            c["model"] = gr.Model3D(label="Result", elem_id="kiln-bake-model", height=420,
                                    clear_color=(0.93, 0.93, 0.95, 1.0))
            c["download"] = gr.DownloadButton("Download GLB", visible=False, elem_id="kiln-bake-dl")
            result_files(c, "kiln-bake")
    return BakeTab(**c)


# the other formats as the page offers them: (label, --format name)
FORMAT_CHOICES = [("OBJ (.zip with .mtl + texture)", "obj"), ("STL (z up)", "stl"), ("PLY mesh (vertex colours)", "ply")]


def format_widgets(c: dict, s: Settings, prefix: str) -> None:
    """The download choices: formats besides the GLB, the texture's encoding, the STL's units
    (``export.formats``, ``export.texture_format``, ``export.units``; choices from the settings)."""
    c["formats"] = gr.CheckboxGroup(label="Also download as", choices=FORMAT_CHOICES,
                                    value=[f for f in s.export.formats if f != "glb"], elem_id=f"{prefix}-formats",
                                    info="the GLB is always made; these go beside it")
    with gr.Row():
        c["texture_format"] = gr.Radio(label="Texture file", choices=list(allowed_values("export.texture_format")),
                                       value=s.export.texture_format, elem_id=f"{prefix}-texture-format",
                                       info="jpeg / webp: about 2-3 times smaller files")
        c["units"] = gr.Radio(label="STL units", choices=list(allowed_values("export.units")), value=s.export.units,
                              elem_id=f"{prefix}-units", info="the model's coordinates taken as metres")


def result_files(c: dict, prefix: str) -> None:
    """The other formats' downloads and every file's size, shown when a job is done."""
    c["more_files"] = gr.File(label="Other formats", file_count="multiple", interactive=False, visible=False,
                              elem_id=f"{prefix}-dl-more")
    c["file_sizes"] = gr.Markdown("", elem_id=f"{prefix}-file-sizes")
