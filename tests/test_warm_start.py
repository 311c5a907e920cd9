"""Worker start-up stays cheap: the GL rasterizer's safety import is Triton alone, not
torch's whole compiler stack (~3 s of every worker start, and nothing in the pipeline
uses it: the bake has its own Adam)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_moderngl_rasterization_does_not_import_torch_dynamo():
    code = (
        "import sys, numpy as np, trimesh\n"
        "from pipeline.types import Mesh\n"
        "from pipeline.raster import rasterize\n"
        "m = trimesh.creation.icosphere(2)\n"
        "uv = (m.vertices[:, :2] * 0.5 + 0.5).clip(0, 1).astype(np.float32)\n"
        "r = rasterize.rasterize_uv(rasterize.raster_context(), Mesh(m.vertices.astype(np.float32), m.faces.astype(np.int32), uvs=uv), 32)\n"
        "assert (r.tri_id >= 0).any()\n"
        "print('torch._dynamo' in sys.modules)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "False"
