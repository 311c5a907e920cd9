"""Whether a surface point is the one a depth map shows: the tolerance the multi-view
bake and the photo projection both test visibility with.

Depth varies across a pixel on a slanted surface, so the tolerance is a relative part of
the depth plus a pixel's footprint stretched by the surface's slope; the slope is capped
so that a grazing texel cannot see through a thin wall.
"""

from __future__ import annotations

DEPTH_REL_TOL = 0.004     # |z_texel - z_depthmap| <= this * z ...
MAX_SLOPE = 10.0          # ... plus footprints x tan(view angle), tan capped at this


def depth_tolerance(z, cos, pixel, footprints: float):
    """Allowed |z_texel - z_depthmap| for N texels: numpy arrays or torch tensors (written
    with what both have, so the bake on a device and the host's photo projection share it).

    z:     (N,) camera depth of the texels
    cos:   (N,) cosine of the angle between the surface normal and the view ray
    pixel: (N,) size of one pixel at the texel's depth, in world units
    footprints: how many pixel footprints the slope may stretch (the caller's choice)
    """
    tan = (1.0 - cos.clip(0, 1) ** 2) ** 0.5 / cos.clip(min=1.0 / MAX_SLOPE)
    return DEPTH_REL_TOL * abs(z) + footprints * pixel * tan
