"""One moderngl RasterContext for the test process's main thread (contexts are owned by
the thread that makes them; pytest runs tests on its main thread)."""

from __future__ import annotations

from pipeline.raster import rasterize as R

_GL: list = []


def gl_context() -> R.RasterContext:
    """This process's moderngl context, made on first use and kept (released at exit)."""
    if not _GL or _GL[0].released:
        _GL[:] = [R.raster_context("moderngl")]
    return _GL[0]
