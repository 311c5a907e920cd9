"""The one decision of which renderer, rasterizer and device a job uses (pipeline/backends.py)."""

from __future__ import annotations

import pytest
import torch

from kiln.records import Capabilities
from kiln.settings import Settings
from pipeline.backends import (Backends, check_backend, needed_capabilities, requirements, resolve_backends,
                               torch_device, unmet_requirements)
from pipeline.validate import StageInputError

ALL_GPU = Capabilities(cuda=True, gsplat=True, nvdiffrast=True, moderngl=True)


def _settings(**changes) -> Settings:
    return Settings().override(changes)


@pytest.mark.parametrize("changes, caps, expected", [
    ({}, None, ("cpu", "moderngl", "cpu")),
    ({}, ALL_GPU, ("gsplat", "nvdiffrast", "cuda")),
    ({}, Capabilities(cuda=True, gsplat=False, nvdiffrast=True), ("cpu", "nvdiffrast", "cuda")),
    ({}, Capabilities(cuda=False, gsplat=True, nvdiffrast=True), ("cpu", "moderngl", "cpu")),
    ({"worker.device": "cpu"}, ALL_GPU, ("cpu", "moderngl", "cpu")),
    # explicit choices win, even where the probe said no (the job then fails up front)
    ({"views.backend": "gsplat", "rasterize.backend": "nvdiffrast"}, None, ("gsplat", "nvdiffrast", "cpu")),
    ({"views.backend": "cpu", "rasterize.backend": "moderngl"}, ALL_GPU, ("cpu", "moderngl", "cuda")),
    ({"worker.device": "cuda"}, Capabilities(gsplat=True), ("gsplat", "moderngl", "cuda")),
])
def test_resolve_backends(changes, caps, expected):
    b = resolve_backends(_settings(**changes), caps)
    assert (b.render, b.rasterize, b.device) == expected and b.chunk_scale == 1.0
    assert resolve_backends(_settings(**changes), caps, chunk_scale=0.5).chunk_scale == 0.5


def test_requirements_follow_the_stages_a_job_runs():
    s = _settings()
    assert requirements(s, Backends("gsplat", "nvdiffrast", "cuda")) == [
        ("cuda", "device 'cuda'"), ("gsplat", "render backend 'gsplat'"),
        ("nvdiffrast", "rasterizer 'nvdiffrast'")]
    # no bake: no views rendered, nothing rasterized
    assert requirements(_settings(**{"bake.enabled": False}), Backends("gsplat", "nvdiffrast", "cpu")) == []
    sam = _settings(**{"reconstruct.backend": "sam3d", "bake.enabled": False})
    assert requirements(sam, Backends()) == [("sam3d", "reconstruction backend 'sam3d'")]


@pytest.mark.parametrize("changes, caps, expected", [
    ({}, None, {"moderngl"}),                                        # nothing probed: the CPU twins
    ({}, ALL_GPU, {"cuda", "gsplat", "nvdiffrast"}),                 # auto on a working GPU
    ({"views.backend": "gsplat"}, None, {"gsplat", "moderngl"}),     # named: needed, on whatever device
    ({"worker.device": "cuda"}, None, {"cuda", "moderngl"}),
    ({"bake.enabled": False, "views.backend": "gsplat"}, ALL_GPU, {"cuda"}),
])
def test_needed_capabilities_one_rule_for_jobs_doctor_and_selftest(changes, caps, expected):
    assert needed_capabilities(_settings(**changes), caps) == expected


def test_unmet_requirements_name_the_choice_and_the_probe_reason():
    s = _settings(**{"views.backend": "gsplat"})
    caps = Capabilities(cuda=True, gsplat=False, moderngl=True, reasons={"gsplat": "build failed: nvcc 9.1"})
    b = resolve_backends(s, caps)
    assert unmet_requirements(s, b, caps) == ("settings ask for render backend 'gsplat', which does not "
                                              "work on this worker: build failed: nvcc 9.1")
    assert unmet_requirements(_settings(), resolve_backends(_settings(), caps), caps) is None
    assert "probe failed" in unmet_requirements(_settings(), Backends(), Capabilities())


def test_backend_names_are_checked():
    check_backend("render", "gsplat")
    check_backend("rasterizer", "moderngl")
    with pytest.raises(StageInputError, match="unknown render backend 'nvdiffrast'"):
        check_backend("render", "nvdiffrast")
    with pytest.raises(StageInputError, match="unknown rasterizer backend 'gsplat'; choose one of "
                                              "moderngl, nvdiffrast"):
        check_backend("rasterizer", "gsplat")


def test_torch_device():
    assert torch_device("cpu", "bake") == torch.device("cpu")
    with pytest.raises(StageInputError, match="bake device 'gpu0' is not a torch device"):
        torch_device("gpu0", "bake")
    with pytest.raises(StageInputError, match="'cpu' or 'cuda"):
        torch_device("meta", "render")
    with pytest.raises(StageInputError, match="render backend 'gsplat' runs only on CUDA"):
        torch_device("cpu", "render", "gsplat")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on machines without CUDA")
def test_torch_device_without_cuda_says_so():
    with pytest.raises(StageInputError, match="bake device 'cuda' requested but CUDA is not available"):
        torch_device("cuda", "bake")
