"""Several objects selected on one photo, made into one scene by a reconstruction that lays them
out (``pipeline.scene.photo_scene``), and refused by one that cannot.

SAM 3D Objects cannot run here (no weights, no GPU), so its model is faked at the model boundary
only: ``tests/fake_sam3d``'s stand-in pipeline returns SAM 3D's documented outputs (a box as its
real ``Gaussian`` and ``MeshExtractResult``, its pose ``rotation``/``translation``/``scale`` in the
camera frame and a ray-cast ``pointmap``), one pose per object. Everything after ``pipeline.run``
is Kiln's real code: ``reconstruct_sam3d``, the conversion, the layout, the scene bake, the GLB.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

from tests.test_sam3d import FAKE, HAVE_SAM3D_PYPI

# two boxes in SAM 3D's camera frame (PyTorch3D axes: x left, y up, z forward), the second
# farther away and to the other side
POSES = ({"translation": (0.9, 0.1, 3.0), "scale": 0.7},
         {"translation": (-0.8, -0.1, 4.2), "scale": 0.9})
H, W = 120, 160


@pytest.fixture
def fake_sam3d(monkeypatch):
    """SAM 3D's pipeline as the stand-in, one pose per object: ``run`` answers with the pose
    whose silhouette the given mask is (as the real model reconstructs the masked object)."""
    if not HAVE_SAM3D_PYPI:
        pytest.skip("the sam3d PyPI package (test extra) is not installed: pip install -e .[test]")
    monkeypatch.syspath_prepend(str(FAKE))
    from pipeline.recon import sam3d
    from sam3d_objects.pipeline.inference_pipeline_pointmap import InferencePipelinePointMap, silhouette

    models = [InferencePipelinePointMap(**p) for p in POSES]
    masks = [silhouette(H, W, **p) for p in POSES]

    class ByMask:
        def run(self, image, mask=None, seed=None, **kwargs):
            seen = np.asarray(image)[..., 3] > 0
            best = max(range(len(masks)), key=lambda i: (seen & masks[i]).sum() / max(1, (seen | masks[i]).sum()))
            return models[best].run(image, mask, seed, **kwargs)

    monkeypatch.setattr(sam3d, "load_pipeline", lambda config: ByMask())
    yield masks
    for name in [m for m in sys.modules if m == "sam3d_objects" or m.startswith("sam3d_objects.")]:
        del sys.modules[name]


def _settings(backend: str):
    from kiln.settings import load

    return load(None, {"reconstruct.backend": backend, "reconstruct.sam3d_config": "/nowhere/pipeline.yaml",
                       "bake.texture_size": 256, "bake.mode": "fast", "views.count": 4,
                       "mesh.simplify_ratio": 0.0})


def _photo(masks) -> np.ndarray:
    rgb = np.full((H, W, 3), 40, np.uint8)
    rgb[masks[0]] = (220, 60, 40)
    rgb[masks[1]] = (40, 90, 220)
    return rgb


def test_layout_makes_one_scene_in_the_camera_frame(fake_sam3d, tmp_path):
    """Each object lands where SAM 3D's pose puts it (in the GLB's camera frame, OpenGL axes:
    x right, y up, the camera looking down -z), keeps that pose (its silhouette fits its mask),
    and is a node of its own."""
    from pipeline.backends import resolve_backends
    from pipeline.scene.photo_scene import bake_photo_scene
    from tests.raster_helpers import gl_context
    from tests.test_scene_bake import nodes_of

    masks = fake_sam3d
    s = _settings("sam3d")
    got = bake_photo_scene(_photo(masks), masks, s, resolve_backends(s), tmp_path, gl_context())
    res = got.bake
    assert [o.name for o in res.stats.scene] == ["object-1", "object-2"]
    assert all(o.placement["how"] == "kept" for o in res.stats.scene), [o.placement for o in res.stats.scene]
    assert all(o.silhouette["iou"] >= 0.8 for o in res.stats.scene), [o.silhouette for o in res.stats.scene]
    centres = {name: (v.min(axis=0) + v.max(axis=0)) / 2 for name, (v, *_) in nodes_of(res.glb_path).items()}
    assert sorted(centres) == ["object-1", "object-2"]
    for i, pose in enumerate(POSES, start=1):
        x, y, z = pose["translation"]
        # PyTorch3D camera -> OpenGL camera: x and z change sign; a 0.7-0.9 m box, so 5 cm is tight
        np.testing.assert_allclose(centres[f"object-{i}"], (-x, y, -z), atol=0.05)
    assert [m["backend"] for m in got.reconstructions] == ["sam3d", "sam3d"]


def test_a_scenes_reconstructions_are_cached_as_a_single_jobs_are(fake_sam3d, monkeypatch, tmp_path):
    """With a cache folder (the worker passes its own), each object's reconstruction is stored
    there; a second scene that changes only the bake's settings reconstructs nothing again."""
    from pipeline.backends import resolve_backends
    from pipeline.recon import sam3d
    from pipeline.scene.photo_scene import bake_photo_scene
    from tests.raster_helpers import gl_context

    masks = fake_sam3d
    inner = sam3d.load_pipeline
    runs = []

    class Counting:
        def __init__(self, model):
            self.model = model

        def run(self, *args, **kwargs):
            runs.append(1)
            return self.model.run(*args, **kwargs)

    monkeypatch.setattr(sam3d, "load_pipeline", lambda config: Counting(inner(config)))
    s = _settings("sam3d")
    first = bake_photo_scene(_photo(masks), masks, s, resolve_backends(s), tmp_path / "a", gl_context(),
                             cache_dir=tmp_path / "cache")
    assert len(runs) == 2 and not first.bake.stats.reconstruction_cached
    other = s.override({"bake.texture_size": 512})
    second = bake_photo_scene(_photo(masks), masks, other, resolve_backends(other), tmp_path / "b", gl_context(),
                              cache_dir=tmp_path / "cache")
    assert len(runs) == 2 and second.bake.stats.reconstruction_cached
    assert [o.name for o in second.bake.stats.scene] == ["object-1", "object-2"]


def test_no_layout_is_refused_before_any_reconstruction(tmp_path):
    """The built-in reconstruction has no depth of its own: refused with what a scene needs."""
    from pipeline.backends import resolve_backends
    from pipeline.scene.photo_scene import bake_photo_scene
    from pipeline.validate import StageInputError

    masks = [np.zeros((H, W), bool), np.zeros((H, W), bool)]
    masks[0][20:60, 20:60] = True
    masks[1][50:100, 90:140] = True
    s = _settings("builtin")
    calls = []
    with pytest.raises(StageInputError, match="reconstruct.backend = sam3d"):
        bake_photo_scene(_photo(masks), masks, s, resolve_backends(s), tmp_path, None,
                         reconstruct=lambda *a: calls.append(a))
    assert calls == []


def test_an_object_without_a_pose_is_refused(fake_sam3d, monkeypatch, tmp_path):
    """SAM 3D answering without a pose for one object: the scene is refused naming it, not laid
    out some other way."""
    from pipeline.backends import resolve_backends
    from pipeline.scene.photo_scene import bake_photo_scene
    from pipeline.validate import StageInputError

    from sam3d_objects.pipeline.inference_pipeline_pointmap import InferencePipelinePointMap

    masks = fake_sam3d
    s = _settings("sam3d")
    from pipeline.recon import sam3d

    unposed = InferencePipelinePointMap(return_pose=False, **POSES[1])
    real = sam3d.load_pipeline("x")

    class SecondUnposed:
        def run(self, image, mask=None, seed=None, **kwargs):
            seen = np.asarray(image)[..., 3] > 0
            if (seen & masks[1]).sum() > (seen & masks[0]).sum():
                return unposed.run(image, mask, seed, **kwargs)
            return real.run(image, mask, seed, **kwargs)

    monkeypatch.setattr(sam3d, "load_pipeline", lambda config: SecondUnposed())
    with pytest.raises(StageInputError, match="object 2 has no place in the photo"):
        bake_photo_scene(_photo(masks), masks, s, resolve_backends(s), tmp_path, None)


def test_a_scene_jobs_masks_go_through_the_job_store(tmp_path):
    """The page's scene job keeps every object's mask beside the photo (inputs/mask_2.png, ...)
    and the worker reads them back in order; a job of one object has none more."""
    from kiln.settings import Settings
    from worker.jobs.jobstore import JobStore, load_inputs, load_more_masks

    store = JobStore(tmp_path / "jobs")
    rgb = np.full((H, W, 3), 40, np.uint8)
    masks = [np.zeros((H, W), bool) for _ in range(3)]
    for i, m in enumerate(masks):
        m[10 + 30 * i:30 + 30 * i, 20:60] = True
    st = store.create(rgb, masks[0], Settings(), "s", more_masks=tuple(masks[1:]))
    d = store.job_dir(st.id)
    _, first = load_inputs(d)
    more = load_more_masks(d)
    assert np.array_equal(first, masks[0]) and len(more) == 2
    assert all(np.array_equal(a, b) for a, b in zip(more, masks[1:]))
    one = store.create(rgb, masks[0], Settings(), "s")
    assert load_more_masks(store.job_dir(one.id)) == []


def test_a_scene_jobs_record_has_a_scenes_stages(tmp_path):
    """The dispatcher weighs a scene job's progress over a scene's stages (read from the job's
    folder, so a resumed job's too): an image job with more masks, a bake job whose request
    is a scene; a job of one object keeps its own."""
    from kiln.bakerequest import BakeRequest
    from kiln.settings import Settings
    from kiln.stages import MODEL_STAGES, STAGES, stages_for
    from worker.jobs.jobstore import JobStore
    from worker.pool.jobrecord import JobRecord

    store = JobStore(tmp_path / "jobs")
    rgb = np.full((H, W, 3), 40, np.uint8)
    mask = np.zeros((H, W), bool)
    mask[20:60, 20:60] = True

    def stages(st):
        return JobRecord(status=st, dir=store.job_dir(st.id), settings=Settings()).stages

    assert stages(store.create(rgb, mask, Settings(), "s", more_masks=(mask,))) == stages_for(True, scene=True)
    assert stages(store.create(rgb, mask, Settings(), "s")) == STAGES
    scene = store.create_bake(BakeRequest(mesh="mesh/a.ply", scene=True), {}, Settings(), "s")
    assert stages(scene) == stages_for(True, "bake", scene=True) != MODEL_STAGES
    assert stages(store.create_bake(BakeRequest(mesh="mesh/a.ply"), {}, Settings(), "s")) == MODEL_STAGES


def test_the_supervisor_refuses_a_scene_its_reconstruction_cannot_lay_out(tmp_path):
    """Several masks with the built-in reconstruction: refused at submit with what a scene
    needs, before any job is written."""
    from kiln.settings import Settings
    from worker.pool.supervisor import Supervisor

    sup = Supervisor(Settings(), jobs_dir=tmp_path / "jobs")
    rgb = np.full((H, W, 3), 40, np.uint8)
    mask = np.zeros((H, W), bool)
    mask[20:60, 20:60] = True
    with pytest.raises(ValueError, match="no depth of its own"):
        sup.submit(rgb, mask, Settings(), more_masks=(mask,))
    assert not any((tmp_path / "jobs").iterdir())
