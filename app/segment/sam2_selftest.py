"""``kiln selftest``'s SAM2 twin: the same click segmented on CUDA and on the CPU.

SAM2 is the front end's model (the app segments on the CPU), so this check lives here
and is handed to ``worker.checks.selftest`` as a ``TwinCheck``; the worker layer runs it in a
spawned child like its own twins.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from worker.checks.selftest import TwinCheck

SAM2_IOU_MIN = 0.98


def segment_click(info, rgb, click, device: str):
    """One click segmented by a freshly loaded predictor on ``device``: ((H, W) bool mask,
    seconds). The predictor's device follows its model's (sam2 gives it no setter)."""
    import time

    import numpy as np
    import torch

    from app.segment.sam2_model import load_predictor

    t0 = time.perf_counter()
    pred = load_predictor(info)
    pred.model.to(device)
    with torch.inference_mode():
        pred.set_image(rgb)
        masks, _, _ = pred.predict(point_coords=click, point_labels=np.array([1]), multimask_output=False)
    return masks[0] > 0.5, round(time.perf_counter() - t0, 3)


def twin_sam2(settings) -> dict:
    """Runs in the spawned child: mask IoU between the CUDA and the CPU predictor."""
    import numpy as np

    from kiln.checkpoints import resolve_checkpoint
    from kiln.examples import draw_object

    info = resolve_checkpoint(settings.app)
    if info is None:   # no_checkpoint skips this twin then; a child started anyway says why
        return {"ok": False, "error": "no SAM2 checkpoint is configured or found"}
    rgb, mask = draw_object(256, kind="toy", seed=1)
    ys, xs = np.nonzero(mask)
    click = np.array([[xs[len(xs) // 2], ys[len(ys) // 2]]], np.float32)
    gpu, gpu_s = segment_click(info, rgb, click, "cuda")
    cpu, cpu_s = segment_click(info, rgb, click, "cpu")
    iou = float((gpu & cpu).sum() / max(1, (gpu | cpu).sum()))
    return {"ok": iou >= SAM2_IOU_MIN, "max_diff": 1.0 - iou, "gpu_s": gpu_s, "cpu_s": cpu_s,
            "note": f"{Path(info.path).name}: mask IoU {iou:.4f} (>= {SAM2_IOU_MIN}); max diff = 1 - IoU"}


def no_checkpoint(settings) -> Optional[str]:
    from kiln.checkpoints import resolve_checkpoint

    ckpt = resolve_checkpoint(settings.app)
    if ckpt is None or not ckpt.exists:
        return "no SAM2 checkpoint found (app.sam2_checkpoint, checkpoints/)"
    return None


SAM2_TWIN = TwinCheck("SAM2 on CUDA vs CPU", twin_sam2, skip=no_checkpoint, needs_cuda=True)
