"""The faces of a mesh that hold parts of the photo's object too thin for its simplified copy.

Quadric simplification charges a collapse by how far it moves the surface in world units,
so a part a few pixels wide costs almost nothing to fold away, whatever it means to the
silhouette: at the default ratio (0.95) a 2 px stem that the reconstruction kept lost 99 %
of its pixels in the GLB, and a 4 px one 64 % (tests/test_thin_parts.py). The mesh stage
therefore simplifies the faces found here on their own terms (``mesh_ops.simplify_mesh``'s
``keep``).

A part is too thin when it is narrower than the edges the simplified mesh will have: with
a fraction 1 - ratio of the faces left, the typical edge grows by about 1 / sqrt(1 - ratio),
so the cleaned mesh's median edge seen from the photo's camera times that is the width
below which a part of the mask is at risk (``thin_parts.narrow_parts``).
"""

from __future__ import annotations

import math

import numpy as np

from pipeline.recon.thin_parts import narrow_parts
from pipeline.types import Mesh, SourceCamera


def thin_part_faces(mesh: Mesh, camera: SourceCamera, mask: np.ndarray, ratio: float) -> np.ndarray:
    """(F,) bool: the faces whose centre, seen from ``camera``, lies on a thin part of ``mask``.

    mesh: the cleaned mesh about to be simplified by ``ratio`` (in [0, 1)); camera: the photo's
    camera in the mesh's frame; mask: (H, W) bool, the photo's object mask, of the camera's
    size (any other size finds nothing, as does a ratio of 0).
    A thin part's faces are found a little beyond its pixels (a median edge), so the faces
    that join it to the body are kept with it rather than cut through.
    """
    faces = mesh.faces
    none = np.zeros(len(faces), bool)
    mask = np.asarray(mask, bool)
    if ratio <= 0.0 or mask.shape != (camera.height, camera.width) or not mask.any():
        return none
    px, z = camera.project(mesh.vertices)
    in_front = z[faces].min(axis=1) > 0 if camera.projection == "perspective" else np.ones(len(faces), bool)
    corners = px[faces]                                             # (F, 3, 2)
    edge = float(np.median(np.linalg.norm(corners[:, [1, 2, 0]] - corners, axis=2)[in_front]))
    if not math.isfinite(edge) or edge <= 0.0:
        return none
    width = edge / math.sqrt(1.0 - ratio)
    # work on the mask's bounding box, padded: a photo can be 12 MP and the object small
    rows, cols = np.nonzero(mask)
    pad = int(math.ceil(width + edge)) + 2
    r0, c0 = max(rows.min() - pad, 0), max(cols.min() - pad, 0)
    r1, c1 = min(rows.max() + pad + 1, mask.shape[0]), min(cols.max() + pad + 1, mask.shape[1])
    thin = narrow_parts(mask[r0:r1, c0:c1], width)
    if not thin.any():
        return none
    import cv2

    reach = int(math.ceil(edge))
    thin = cv2.dilate(thin.astype(np.uint8), cv2.getStructuringElement(
        cv2.MORPH_ELLIPSE, (2 * reach + 1, 2 * reach + 1))) > 0
    centre = corners.mean(axis=1)
    col = np.floor(centre[:, 0]).astype(np.int64) - c0
    row = np.floor(centre[:, 1]).astype(np.int64) - r0
    inside = in_front & (col >= 0) & (row >= 0) & (col < thin.shape[1]) & (row < thin.shape[0])
    out = none.copy()
    out[inside] = thin[row[inside], col[inside]]
    return out
