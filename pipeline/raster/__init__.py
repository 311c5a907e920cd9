"""Rasterizers with explicit contexts (moderngl, nvdiffrast) and how their answers are compared."""
