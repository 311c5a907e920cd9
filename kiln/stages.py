"""The pipeline's stages, by name and in order, with each one's rough share of a job's time.

Pure data, no imports: the supervisor turns a stage's progress into one number for the
whole job without importing ``pipeline/`` (or torch), and the pipeline, the benchmarks and
the progress display all name the same stages.
"""

from __future__ import annotations

# Every stage, in the order a job with baking runs them.
STAGES = ("reconstruct", "render_views", "mesh", "uv", "bake", "export")
# Without baking there are no views to render and no texture to unwrap for.
UNBAKED_STAGES = ("reconstruct", "mesh", "export")
# A bake job (``kiln bake``): "read" reads the files, puts the splat on the mesh and finds
# the photo's camera; render_views runs only with a splat, mesh and uv only for new UVs.
MODEL_STAGES = ("read", "render_views", "mesh", "uv", "bake", "export")
# A fit job (the bake tab's "Fit the camera to the photo", ``/fit_camera``): the files read,
# then the photo's camera fitted to the mask (the splat's frame found first when it has one).
FIT_STAGES = ("read", "fit")
# A scene (several objects of one photo, ``pipeline.scene``): its files read (a bake job) or
# every object reconstructed (a photo job), the objects placed under the photo's camera, the
# depth test across them, each object's own bake ("objects": its render_views .. export, one
# object after the other, as shares of this one stage) and the objects' GLBs joined.
SCENE_STEPS = ("place", "occlusion", "objects", "join")
# Rough share of a job's time per stage; each job weighs its own stages against each other.
WEIGHTS = {"reconstruct": 0.30, "read": 0.15, "render_views": 0.15, "mesh": 0.05, "uv": 0.15,
           "bake": 0.30, "export": 0.05, "fit": 0.85, "place": 0.15, "occlusion": 0.02, "objects": 0.60,
           "join": 0.02}


def stages_for(bake_enabled: bool, kind: str = "image", scene: bool = False) -> tuple[str, ...]:
    """The stages a job runs, in order: an "image" job (a photo reconstructed), a "bake"
    job (a model someone made) or a "fit" job (that model's camera fitted to its photo);
    ``scene``: an image or bake job of several objects of one photo (always baked)."""
    if kind == "fit":
        return FIT_STAGES
    if scene:
        return ("read" if kind == "bake" else "reconstruct",) + SCENE_STEPS
    if kind == "bake":
        return MODEL_STAGES
    return STAGES if bake_enabled else UNBAKED_STAGES


# Reconstruction backends that give each object its place in the photo's camera frame (SAM 3D
# Objects: a pose per object and the photo's point map). Only these make one scene of several
# objects selected on one photo (``pipeline.scene.photo_scene``); the page and the worker both
# say why the others cannot, in these words.
LAYOUT_BACKENDS = ("sam3d",)


def scene_problem(backend: str) -> str:
    """Why the reconstruction ``backend`` cannot make one scene of several objects ("" when it can)."""
    if backend in LAYOUT_BACKENDS:
        return ""
    return ("a scene of several objects needs a reconstruction that places them (SAM 3D Objects: "
            "setting reconstruct.backend = sam3d, with reconstruct.sam3d_config); the "
            f"{backend} reconstruction has no depth of its own, so each object is made as its own model")
