"""What the bake gives the texels no photo sees: the mirror side, then a fill on the surface.

The bake (``pipeline.texture.bake.bake_texture``) calls these two steps and nothing else of
the mirror or the fill, so whoever changes how photos are chosen per texel hands them
"what the photos saw" (a colour and a confidence per texel) and gets the rest for free.
Order of sources per texel (docs/texture-sources.md): the photo; the mirror image of a point
a photo sees; the splat's views; the mesh's own colours; the fill along the surface.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import numpy as np

from pipeline.texture.mirror_fill import MirrorFill, MirrorRules, Resample, mirror_fill
from pipeline.texture.surface_fill import SurfaceFill, hidden_edge_trust
from pipeline.texture.symmetry import SymmetrySearch
from pipeline.types import ImageInput, Mesh, SourceCamera

if TYPE_CHECKING:
    from pipeline.raster.rasterize import RasterContext



@dataclass(frozen=True)
class PhotoSeen:
    """What the photos saw of N chart texels: colors (N, 3) float32, confidence (N,) float32
    in [0, 1] (0: unseen), trust (N,) float32 in [0, 1]: how far those colours may be spread
    to other texels (0 near a mask edge where something in front hid the object)."""

    colors: np.ndarray
    confidence: np.ndarray
    trust: np.ndarray


def photo_seen(mesh: Mesh, positions: np.ndarray, colors: np.ndarray, weight: np.ndarray,
               photo: ImageInput, camera: SourceCamera, raster_ctx: "RasterContext",
               mask_hides: bool) -> PhotoSeen:
    """One photo's ``PhotoSeen``. ``mask_hides``: the mask may leave out what stands in front
    of the object (a model baked from someone's photo); then colours near the stretches of
    the mask's edge the mesh runs past are not spread. Kiln's own reconstruction's mask is
    its silhouette: nothing hides it."""
    trust = hidden_edge_trust(mesh, positions, photo.mask, camera, raster_ctx) if mask_hides \
        else np.ones(len(positions), np.float32)
    return PhotoSeen(colors=colors, confidence=weight, trust=trust)


def mirror_for(mesh: Mesh, positions: np.ndarray, normals: np.ndarray, seen: PhotoSeen,
               rules: MirrorRules = MirrorRules(), search: SymmetrySearch = SymmetrySearch(),
               resample: Optional[Resample] = None) -> MirrorFill:
    """The mirror's colours for the texels: the mesh's plane, checked against the photos;
    ``resample`` reads the photos at the mirror images (``mirror_fill.Resample``)."""
    plane = search.find(mesh.vertices, mesh.faces)
    return mirror_fill(positions, normals, seen.colors, seen.confidence * seen.trust, plane, rules, resample)


def fill_on_surface(positions: np.ndarray, normals: np.ndarray, colors: np.ndarray, known: np.ndarray,
                    trust: Optional[np.ndarray], chart_texels: int, surface_area: float,
                    fill: SurfaceFill = SurfaceFill()) -> np.ndarray:
    """(N, 3) float32: ``colors`` where ``known``, the surface fill elsewhere.
    trust: (N,) how far each known colour may be spread (None: all of them)."""
    w = known.astype(np.float32) if trust is None else np.where(known, trust, 0.0).astype(np.float32)
    texel = float(np.sqrt(surface_area / max(chart_texels, 1)))
    out = colors.astype(np.float32).copy()
    holes = ~known
    if holes.any():
        out[holes] = fill.fill(positions, normals, colors, w, holes, texel_size=texel)
    return out
