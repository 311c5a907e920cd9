"""A scene to test with: a red ball before a blue board, photographed from the origin."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def ball_before_board():
    """A red ball before a blue board, photographed by a 300 px focal length camera at the
    origin (OpenGL axes). The ball's mask is what the photo shows of it; the board's is its
    whole outline, the part behind the ball too (an amodal mask): only the depth test across
    the objects can tell that the ball's pixels are not the board's."""
    import trimesh

    from pipeline.io.camera_file import camera_from_focal
    from pipeline.raster.rasterize import rasterize_views
    from pipeline.types import Mesh
    from tests.raster_helpers import gl_context

    ball = trimesh.creation.icosphere(subdivisions=3, radius=0.35)
    ball.apply_translation([0.15, 0.0, -2.2])
    board = trimesh.creation.box(extents=[1.6, 1.0, 0.1]).subdivide().subdivide().subdivide()
    board.apply_translation([0.0, 0.0, -3.2])
    meshes = [Mesh(vertices=np.asarray(m.vertices, np.float32), faces=np.asarray(m.faces, np.int32))
              for m in (ball, board)]
    w, h = 320, 240
    cam = camera_from_focal(300.0, w, h, frame="opengl")
    rasters = [rasterize_views(gl_context(), m, cam.as_cameras()) for m in meshes]
    depth = [np.where(r.tri_id[0] >= 0, r.depth[0], np.inf) for r in rasters]
    ball_seen = np.isfinite(depth[0]) & (depth[0] <= depth[1])
    board_all = np.isfinite(depth[1])
    rgb = np.full((h, w, 3), 128, np.uint8)
    rgb[board_all] = (30, 60, 220)
    rgb[ball_seen] = (220, 40, 30)
    return meshes, cam, rgb, ball_seen, board_all


def write_ball_before_board(folder: Path) -> dict[str, Path]:
    """The scene as files, as a person would give them: ball.ply, board.ply (meshes in the
    camera's frame, OpenGL axes), photo.png, ball_mask.png, board_mask.png; focal 300 px."""
    import trimesh
    from PIL import Image

    meshes, _, rgb, ball_mask, board_mask = ball_before_board()
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, mesh in (("ball", meshes[0]), ("board", meshes[1])):
        out[name] = folder / f"{name}.ply"
        trimesh.Trimesh(mesh.vertices, mesh.faces, process=False).export(out[name])
    out["photo"] = folder / "photo.png"
    Image.fromarray(rgb).save(out["photo"])
    for name, m in (("ball_mask", ball_mask), ("board_mask", board_mask)):
        out[name] = folder / f"{name}.png"
        Image.fromarray(m.astype(np.uint8) * 255).save(out[name])
    return out
