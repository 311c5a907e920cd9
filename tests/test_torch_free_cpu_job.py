"""A job on the CPU never imports torch: the renderer, the photo projection and the bake run in
numpy and compiled loops on the host, so a worker on a machine without a GPU is spared torch's
import (~2 s) and its memory (~500 MB). Checked in a fresh interpreter, for a generate job with
each bake mode and the untextured formats."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

GENERATE = """
import json, sys
from pathlib import Path
import numpy as np
from kiln.settings import load
from pipeline.run import run_pipeline
from pipeline.types import ImageInput
sys.path.insert(0, {tests!r})
from synthetic import make_object_image

rgb, mask = make_object_image(160, "blob", 4)
out = {{}}
for mode in ("fast", "opt"):
    s = load(overrides={{"reconstruct.resolution": 64, "reconstruct.num_gaussians": 3000, "views.count": 6,
                         "views.resolution": 128, "bake.texture_size": 256, "bake.mode": mode,
                         "bake.steps": 20, "export.formats": "obj,stl"}})
    r = run_pipeline(ImageInput(rgb, mask), s, Path({out!r}) / mode)
    out[mode] = r.stats.bake.psnr_db
print(json.dumps({{"torch": "torch" in sys.modules, "psnr": out}}))
"""


def test_a_generate_job_on_the_cpu_never_imports_torch(tmp_path):
    code = GENERATE.format(tests=str(ROOT / "tests"), out=str(tmp_path))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.splitlines()[-1])
    assert got["torch"] is False
    assert all(p is not None and p > 20 for p in got["psnr"].values()), got
