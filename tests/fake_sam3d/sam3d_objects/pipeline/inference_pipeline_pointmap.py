"""Stand-in for ``sam3d_objects.pipeline.inference_pipeline_pointmap`` (the model, not its data).

``InferencePipelinePointMap`` takes pipeline.yaml's keys as keyword arguments (as hydra
passes them) and ``run`` has the real signature and output keys. Instead of a model it
returns a known object, built with SAM 3D's *real* ``Gaussian`` and ``MeshExtractResult``
classes (see ``representations``): an asymmetric box in SAM 3D's local frame (z up,
inside [-0.5, 0.5]^3), as Gaussians (raw parameters behind the real activations) and as
a mesh with colour + normal vertex attributes. The pose ``rotation``/``translation``/
``scale`` places it in PyTorch3D camera space the way ``Transform3d`` applies it (row
vectors: p @ R), and ``pointmap`` is what a pinhole camera with intrinsics ``camera_K``
sees through each pixel of the image it was given: the posed box, or a wall behind it
(ray cast, so the intrinsics are recoverable from it as from MoGe's). Every constructor
and ``run`` call is recorded in ``CALLS``.

Extra yaml keys steer it: pose_wxyz, translation, scale, pose_convention
("pytorch3d-row" | "column"), camera_K (fx, fy as multiples of the image width, cx, cy
as fractions of width/height), pointmap_shrink (1 or 0.5: SAM 3D halves the pointmap of
large images), sh_degree, num_gaussians, return_pose, drop_mesh_key, empty_mesh,
fail_on_load.
"""

import numpy as np
import torch

from sam3d_objects.model.backbone.tdfy_dit.representations import Gaussian, MeshExtractResult, cpu_tensors

CALLS = []

SH_C0 = 0.28209479177387814
BOX_CENTER = np.array([0.05, -0.02, 0.0])
BOX_EXTENTS = np.array([0.6, 0.3, 0.9])
DEFAULT_K = (1.1, 1.1, 0.52, 0.47)
WALL_BEHIND = 5.0


def quat_to_matrix(q):
    """Standard (column-vector) rotation matrix of a (w, x, y, z) quaternion, like
    pytorch3d.transforms.quaternion_to_matrix."""
    w, x, y, z = np.asarray(q, np.float64) / np.linalg.norm(q)
    return np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
                     [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
                     [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)]])


def box_mesh():
    import trimesh

    box = trimesh.creation.box(extents=BOX_EXTENTS).subdivide().subdivide()
    return np.asarray(box.vertices) + BOX_CENTER, np.asarray(box.faces)


def surface_points(verts, faces, n, rng):
    tri = verts[faces]
    area = np.linalg.norm(np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0]), axis=1)
    idx = rng.choice(len(faces), n, p=area / area.sum())
    u, v = rng.random(n), rng.random(n)
    flip = u + v > 1
    u[flip], v[flip] = 1 - u[flip], 1 - v[flip]
    t = tri[idx]
    return t[:, 0] + u[:, None] * (t[:, 1] - t[:, 0]) + v[:, None] * (t[:, 2] - t[:, 0])


def colour_of(points):
    return np.clip(points + 0.5, 0.0, 1.0)


def pose_points(points, q, t, s, convention):
    r = quat_to_matrix(q)
    if convention == "column":
        r = r.T
    return (np.asarray(points) * s) @ r + t


def pixel_K(camera_K, width, height):
    """(3, 3) OpenCV intrinsics in pixels from the yaml's relative camera_K."""
    fx, fy, cx, cy = camera_K
    return np.array([[fx * width, 0.0, cx * width], [0.0, fy * width, cy * height], [0.0, 0.0, 1.0]])


def cast(q, t, s, convention, K, cols, rows):
    """Ray cast the posed box from the camera at the origin through pixel centres
    (cols (w,), rows (h,)). Returns ((h, w, 3) PyTorch3D camera points, (h, w) hit mask)."""
    import trimesh

    verts, faces = box_mesh()
    posed = trimesh.Trimesh(pose_points(verts, q, t, s, convention), faces, process=False)
    cc, rr = np.meshgrid(cols, rows)
    d_cv = np.stack([(cc - K[0, 2]) / K[0, 0], (rr - K[1, 2]) / K[1, 1], np.ones_like(cc)], axis=-1)
    d = d_cv * np.array([-1.0, -1.0, 1.0])          # OpenCV -> PyTorch3D camera axes
    flat = d.reshape(-1, 3)
    points = flat * (t[2] + WALL_BEHIND)             # the wall: z = t_z + 5
    hit = np.zeros(len(flat), bool)
    locs, ray_idx, _ = posed.ray.intersects_location(np.zeros_like(flat), flat, multiple_hits=False)
    points[ray_idx] = locs
    hit[ray_idx] = True
    return points.reshape(d.shape), hit.reshape(d.shape[:2])


def silhouette(height, width, pose_wxyz=(1.0, 0.0, 0.0, 0.0), translation=(0.0, 0.0, 3.0), scale=0.8,
               pose_convention="pytorch3d-row", camera_K=DEFAULT_K, **_):
    """(H, W) bool: pixels whose centre sees the posed box (the mask a user would draw)."""
    K = pixel_K(camera_K, width, height)
    _, hit = cast(np.asarray(pose_wxyz, np.float64), np.asarray(translation, np.float64),
                  np.full(3, float(scale)), pose_convention, K,
                  np.arange(width) + 0.5, np.arange(height) + 0.5)
    return hit


class InferencePipelinePointMap:
    def __init__(self, *args, pose_wxyz=(1.0, 0.0, 0.0, 0.0), translation=(0.0, 0.0, 3.0), scale=0.8,
                 pose_convention="pytorch3d-row", camera_K=DEFAULT_K, pointmap_shrink=1.0, sh_degree=0,
                 num_gaussians=3000, return_pose=True, drop_mesh_key=False, empty_mesh=False,
                 fail_on_load="", decode_formats=("gaussian", "mesh"), rendering_engine="nvdiffrast",
                 compile_model=False, workspace_dir="", device="cuda", **kwargs):
        CALLS.append(("init", dict(rendering_engine=rendering_engine, compile_model=compile_model,
                                   workspace_dir=workspace_dir, **kwargs)))
        if fail_on_load:
            raise RuntimeError(fail_on_load)
        self.pose = (np.asarray(pose_wxyz, np.float64), np.asarray(translation, np.float64),
                     np.full(3, float(scale)))
        self.pose_convention = pose_convention
        self.camera_K = tuple(camera_K)
        self.pointmap_shrink = float(pointmap_shrink)
        self.sh_degree = int(sh_degree)
        self.num_gaussians = int(num_gaussians)
        self.return_pose = return_pose
        self.drop_mesh_key = drop_mesh_key
        self.empty_mesh = empty_mesh
        self.decode_formats = list(decode_formats)

    def _gaussians(self, rng):
        bv, bf = box_mesh()
        n = self.num_gaussians
        pts = surface_points(bv, bf, n, rng)
        scales = rng.uniform(0.004, 0.02, (n, 3))
        quats = rng.normal(size=(n, 4))
        quats /= np.linalg.norm(quats, axis=1, keepdims=True)
        opac = rng.uniform(0.05, 1.0, n)
        opac[:10] = 0.001   # invisible ones, to be dropped
        # the constructor arguments SAM 3D's decoder_gs passes (see its to_representation)
        with cpu_tensors():
            gs = Gaussian(aabb=[-0.5, -0.5, -0.5, 1.0, 1.0, 1.0], sh_degree=self.sh_degree,
                          mininum_kernel_size=0.0009, scaling_bias=0.004, opacity_bias=0.1,
                          scaling_activation="softplus", device="cpu")
        f32 = lambda a: torch.tensor(np.asarray(a), dtype=torch.float32)  # noqa: E731
        gs.from_xyz(f32(pts))
        gs.from_scaling(f32(scales))
        gs.from_rotation(f32(quats))
        gs.from_opacity(f32(opac)[:, None])
        gs.from_features(f32((colour_of(pts) - 0.5) / SH_C0)[:, None, :])
        if self.sh_degree > 0:
            # higher bands after the DC band along dim 2, as Gaussian.get_features concatenates
            k = 3 * ((self.sh_degree + 1) ** 2 - 1)
            gs._features_rest = f32(rng.normal(size=(n, 1, k)))
        self.truth = {"means": pts, "scales": gs.get_scaling.double().numpy(), "quats": quats,
                      "opacities": opac, "colors": colour_of(pts)}
        return gs

    def run(self, image, mask=None, seed=None, stage1_only=False, with_mesh_postprocess=True,
            with_texture_baking=True, with_layout_postprocess=False, use_vertex_color=False,
            stage1_inference_steps=None, stage2_inference_steps=None, use_stage1_distillation=False,
            use_stage2_distillation=False, pointmap=None, decode_formats=None, estimate_plane=False):
        CALLS.append(("run", dict(seed=seed, stage1_only=stage1_only,
                                  with_mesh_postprocess=with_mesh_postprocess,
                                  with_texture_baking=with_texture_baking,
                                  with_layout_postprocess=with_layout_postprocess,
                                  use_vertex_color=use_vertex_color, pointmap=pointmap,
                                  image_shape=tuple(np.asarray(image).shape), mask=mask)))
        image = np.asarray(image)
        assert image.ndim == 3 and image.shape[-1] == 4 and image.dtype == np.uint8  # as the real one
        rng = np.random.default_rng(0 if seed is None else seed)

        verts, faces = box_mesh()
        if self.empty_mesh:
            verts, faces = np.zeros((0, 3)), np.zeros((0, 3), np.int64)
        normals = np.zeros_like(verts)
        vattrs = np.concatenate([colour_of(verts), normals], axis=1)
        mesh = MeshExtractResult(torch.tensor(verts, dtype=torch.float32), torch.tensor(faces),
                                 torch.tensor(vattrs, dtype=torch.float32))
        gs = self._gaussians(rng)

        out = {"gaussian": [gs], "gs": gs, "coords": torch.zeros((1, 4), dtype=torch.int32)}
        if "mesh" in self.decode_formats:
            out["mesh"] = [mesh]
            import trimesh

            glb_verts = verts @ np.array([[1, 0, 0], [0, 0, -1], [0, 1, 0]])  # to_glb's z-up -> y-up
            glb = trimesh.Trimesh(vertices=glb_verts, faces=faces, process=False)
            glb.visual.vertex_colors = colour_of(verts)
            out["glb"] = glb
            if self.drop_mesh_key:
                del out["mesh"]
        else:
            out["glb"] = None

        q, t, s = self.pose
        if self.return_pose:
            out.update(rotation=torch.tensor(q[None], dtype=torch.float32),
                       translation=torch.tensor(t[None], dtype=torch.float32),
                       scale=torch.tensor(s[None], dtype=torch.float32))
            height, width = image.shape[:2]
            f = self.pointmap_shrink
            h, w = int(np.floor(height * f)), int(np.floor(width * f))
            # interpolate(scale_factor=f) samples cell i at input coordinate (i + 0.5) / f
            pm, _ = cast(q, t, s, self.pose_convention, pixel_K(self.camera_K, width, height),
                         (np.arange(w) + 0.5) / f, (np.arange(h) + 0.5) / f)
            out["pointmap"] = torch.tensor(pm, dtype=torch.float32)
            out["pointmap_colors"] = torch.zeros((h, w, 3))
        return out
