"""Every numba-compiled kernel of the pipeline, compiled (or loaded from numba's cache) at once.

The kernels live beside the stages that use them, in modules named ``*_kernels.py`` that
import numba at the top and are themselves imported only when a stage runs. numba compiles
each on its first call and keeps the machine code in the module's ``__pycache__``
(``cache=True``), so only the first run after an install or a change of a kernel compiles:
about 10 s for all of them on two cores. ``./run.sh setup`` calls ``warm_all`` when a
kernel's source changed, so that a job never pays it.
"""

from __future__ import annotations

import numpy as np


def warm_all() -> None:
    """Call each kernel once on a tiny input of the types the stages pass."""
    from kiln.settings import load

    from pipeline.raster.image_sampling import bicubic, bilinear
    from pipeline.texture import back_projection_kernels, near_grid
    from pipeline.texture.opt.host import optimise
    from pipeline.unwrap.uv_metrics import coverage
    from pipeline.views.gaussian_math import project_gaussians
    from pipeline.views.splat_tiles import warm as warm_splats

    warm_splats()
    project_gaussians(np.zeros((1, 3), np.float32), np.eye(3, dtype=np.float32)[None] * 0.01,
                      np.ones(1, np.float32), np.eye(4, dtype=np.float32), np.eye(3, dtype=np.float32) * 8, 8, 8)
    back_projection_kernels.warm()
    near_grid.warm()
    tri = np.array([[0.1, 0.1], [0.9, 0.1], [0.5, 0.9]], np.float32)
    coverage(tri, np.array([[0, 1, 2]], np.int32), 8)
    at = np.array([1.5, 2.25], np.float32)
    bilinear(np.zeros((4, 4), np.float32), at, at)
    bicubic(np.zeros((4, 4, 3), np.float32), at, at)
    uv = np.full((4, 2), 0.5, np.float32)
    optimise(np.zeros((4, 4, 3), np.float32), np.ones((4, 4), bool), uv, np.zeros((4, 3), np.float32),
             load(overrides={"bake.steps": 2}).bake, lambda f, m: None)


if __name__ == "__main__":
    warm_all()
