"""Stand-in for ``sam3d_objects.pipeline.inference_pipeline_pointmap``.

``InferencePipelinePointMap`` takes pipeline.yaml's keys as keyword arguments
(as hydra passes them) and ``run`` has the real signature. Instead of a model it
returns a known object: an asymmetric box in SAM 3D's local frame (z up, inside
[-0.5, 0.5]^3), as Gaussians (raw parameters behind the real activations) and
as a mesh with colour + normal vertex attributes, posed into PyTorch3D camera
space by ``rotation``/``translation``/``scale`` the way PyTorch3D's
``Transform3d`` applies them (row vectors: p @ R), with a pointmap of the
scene. Every constructor and ``run`` call is recorded in ``CALLS``.

Extra yaml keys steer it: pose_wxyz, translation, scale, pose_convention
("pytorch3d-row" | "column"), num_gaussians, return_pose, drop_mesh_key,
empty_mesh, fail_on_load.
"""

import numpy as np
import torch

from sam3d_objects.model.backbone.tdfy_dit.representations import Gaussian, MeshExtractResult

CALLS = []

SH_C0 = 0.28209479177387814
BOX_CENTER = np.array([0.05, -0.02, 0.0])
BOX_EXTENTS = np.array([0.6, 0.3, 0.9])


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


class InferencePipelinePointMap:
    def __init__(self, *args, pose_wxyz=(1.0, 0.0, 0.0, 0.0), translation=(0.0, 0.0, 3.0), scale=0.8,
                 pose_convention="pytorch3d-row", num_gaussians=3000, return_pose=True,
                 drop_mesh_key=False, empty_mesh=False, fail_on_load="",
                 decode_formats=("gaussian", "mesh"), rendering_engine="nvdiffrast",
                 compile_model=False, workspace_dir="", device="cuda", **kwargs):
        CALLS.append(("init", dict(rendering_engine=rendering_engine, compile_model=compile_model,
                                   workspace_dir=workspace_dir, **kwargs)))
        if fail_on_load:
            raise RuntimeError(fail_on_load)
        self.pose = (np.asarray(pose_wxyz, np.float64), np.asarray(translation, np.float64),
                     np.full(3, float(scale)))
        self.pose_convention = pose_convention
        self.num_gaussians = int(num_gaussians)
        self.return_pose = return_pose
        self.drop_mesh_key = drop_mesh_key
        self.empty_mesh = empty_mesh
        self.decode_formats = list(decode_formats)

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

        bv, bf = box_mesh()
        n = self.num_gaussians
        pts = surface_points(bv, bf, n, rng)
        scales = rng.uniform(0.004, 0.02, (n, 3))
        quats = rng.normal(size=(n, 4))
        quats /= np.linalg.norm(quats, axis=1, keepdims=True)
        opac = rng.uniform(0.05, 1.0, n)
        opac[:10] = 0.001   # invisible ones, to be dropped
        gs = Gaussian(aabb=[-0.5, -0.5, -0.5, 1.0, 1.0, 1.0], mininum_kernel_size=0.0009)
        f32 = lambda a: torch.tensor(np.asarray(a), dtype=torch.float32)  # noqa: E731
        gs.from_xyz(f32(pts))
        gs.from_scaling(f32(scales))
        gs.from_rotation(f32(quats))
        gs.from_opacity(f32(opac)[:, None])
        gs.from_features(f32((colour_of(pts) - 0.5) / SH_C0)[:, None, :])
        self.truth = {"means": pts, "scales": gs.get_scaling.numpy().astype(np.float64),
                      "quats": quats, "opacities": opac, "colors": colour_of(pts)}

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
            h, w = image.shape[0] // 2, image.shape[1] // 2
            alpha = image[::2, ::2, 3][:h, :w] > 127
            pm = np.empty((h, w, 3))
            pm[...] = t + np.array([0.0, 0.0, 5.0])          # a wall behind the object
            obj = surface_points(bv, bf, int(alpha.sum()), rng)
            pm[alpha] = pose_points(obj, q, t, s, self.pose_convention)
            out["pointmap"] = torch.tensor(pm, dtype=torch.float32)
            out["pointmap_colors"] = torch.zeros((h, w, 3))
        return out
