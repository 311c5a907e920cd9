"""The opt bake's fit on the host (pipeline.texture.opt.host, compiled, no torch) against the
loop a device runs (pipeline.texture.bake._optimise, torch, here on the CPU): the same steps,
the same fit, to float round-off; and against a texture it must recover."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kiln.settings import load
from pipeline.texture import bake
from pipeline.texture.opt import host


def _problem(size=48, m=20000, seed=0, noise=0.02):
    import cv2

    rng = np.random.default_rng(seed)
    truth = cv2.GaussianBlur(rng.random((size, size, 3)).astype(np.float32), (0, 0), 2)
    uv = rng.uniform(0.02, 0.98, (m, 2)).astype(np.float32)
    idx, w = host.bilinear_taps(uv, size)
    target = ((truth.reshape(-1, 3)[idx] * w[..., None]).sum(1)
              + rng.normal(0, noise, (m, 3))).astype(np.float32)
    chart = np.ones((size, size), bool)
    chart[:, : size // 6] = False
    return truth, uv, target, chart


def _l1(tex, uv, target):
    idx, w = host.bilinear_taps(uv, tex.shape[0])
    return float(np.abs((tex.reshape(-1, 3)[idx] * w[..., None]).sum(1) - target).mean())


def test_the_taps_are_the_bilinear_lookup_torch_makes():
    rng = np.random.default_rng(1)
    image = rng.random((16, 16, 3)).astype(np.float32)
    uv = rng.uniform(-0.05, 1.05, (500, 2)).astype(np.float32)
    idx, w = host.bilinear_taps(uv, 16)
    assert idx.dtype == np.int64 and w.dtype == np.float32 and idx.shape == w.shape == (500, 4)
    np.testing.assert_allclose(w.sum(1), 1.0, atol=1e-6)
    assert (np.diff(np.sort(idx, 1), axis=1) > 0).all()          # four distinct texels a lookup
    ours = (image.reshape(-1, 3)[idx] * w[..., None]).sum(1)
    grid = torch.from_numpy(np.stack([2 * uv[:, 0] - 1, 1 - 2 * uv[:, 1]], 1))[None, None]
    ref = torch.nn.functional.grid_sample(torch.from_numpy(image).permute(2, 0, 1)[None], grid, mode="bilinear",
                                          padding_mode="border", align_corners=False)[0, :, 0].T.numpy()
    np.testing.assert_allclose(ours, ref, atol=1e-5)


@pytest.mark.parametrize("gradient", ["scattered", "gathered"])
def test_the_host_fit_takes_the_device_loops_steps_to_the_same_texture(gradient, monkeypatch):
    # per-thread gradients where the atlas is small, the transpose's gather where it is not
    if gradient == "gathered":
        monkeypatch.setattr(host, "SCATTER_BYTES", 0)
    else:
        assert host._scatter_blocks(48 * 48) >= 2 or pytest.skip("one thread: nothing to scatter into")
    truth, uv, target, chart = _problem()
    rng = np.random.default_rng(2)
    init = np.clip(truth + rng.normal(0, 0.1, truth.shape), 0, 1).astype(np.float32)
    settings = load().bake
    msgs: list[str] = []
    got = host.optimise(init, chart, uv, target, settings, lambda f, m: msgs.append(m))
    ref = bake._optimise(init, chart, uv, target, settings, torch.device("cpu"), lambda f, m: None)
    assert got[0].shape == init.shape and got[0].dtype == np.float32
    assert got[3] == ref[3]                                   # the same steps (and the same stall)
    assert abs(got[2] - ref[2]) < 1e-4                         # PSNR of init on the targets
    np.testing.assert_array_equal(got[1], ref[1])              # touched texels
    assert np.abs(got[0] - ref[0]).mean() < 1e-3
    assert abs(_l1(got[0], uv, target) - _l1(ref[0], uv, target)) < 1e-5
    assert _l1(got[0], uv, target) < _l1(init, uv, target) * 0.8
    assert got[0].min() >= 0.0 and got[0].max() <= 1.0        # bounds held
    assert msgs and msgs[-1].startswith(f"step {got[3]}/")


def test_the_host_fit_recovers_a_texture_from_its_lookups():
    truth, uv, target, chart = _problem(size=32, m=30000, seed=3, noise=0.0)
    settings = load(overrides={"bake.tv_weight": 0.0, "bake.steps": 300, "bake.stop_when_stalled": False}).bake
    tex, touched, _, steps = host.optimise(np.full_like(truth, 0.5), chart, uv, target, settings, lambda f, m: None)
    assert steps == 300
    err = np.abs(tex - truth)[touched]
    assert np.median(err) < 0.01, np.median(err)
