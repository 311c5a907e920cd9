"""SAM2 checkpoint discovery and loading, with checkpoints the tests create.

No weights can be downloaded here, so a random-weight SAM2.1 tiny model is
built from sam2's packaged config (hydra compose + instantiate, as sam2's
build_sam2 does), saved in the official layout ``{"model": state_dict}`` under
the official file name, and then found and loaded through the real loader.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from kiln.checkpoints import find_checkpoints, parse_name, resolve_checkpoint
from kiln.settings import AppSettings

torch = pytest.importorskip("torch")
pytest.importorskip("sam2")

from app.segment.sam2_model import (  # noqa: E402
    Sam2LoadError,
    describe_state_dict,
    load_predictor,
    packaged_configs,
)

TINY = "configs/sam2.1/sam2.1_hiera_t.yaml"
SMALL = "configs/sam2.1/sam2.1_hiera_s.yaml"


def _random_model(config: str, seed: int = 0):
    import sam2  # noqa: F401  (registers sam2's hydra config module)
    from hydra import compose
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    torch.manual_seed(seed)
    cfg = compose(config_name=config)
    OmegaConf.resolve(cfg)
    return instantiate(cfg.model, _recursive_=True)


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory) -> tuple[Path, dict]:
    folder = tmp_path_factory.mktemp("checkpoints")
    sd = _random_model(TINY).state_dict()
    path = folder / "sam2.1_hiera_tiny.pt"
    torch.save({"model": sd}, path)
    return path, sd


def _image() -> np.ndarray:
    # a bright square on a dark background, small so the test stays fast
    rgb = np.full((48, 64, 3), 20, np.uint8)
    rgb[12:36, 20:44] = (220, 180, 40)
    return rgb


# -- discovery (pure Python, no model) -----------------------------------------

def test_official_names_map_to_packaged_configs(tmp_path):
    names = ["sam2.1_hiera_large.pt", "sam2_hiera_small.pt", "sam2.1_hiera_tiny.pt",
             "sam2.1_hiera_base_plus.pt", "sam2_hiera_tiny.pt", "my_finetune.pt", "notes.txt"]
    for n in names:
        (tmp_path / n).write_bytes(b"x")
    found = find_checkpoints(tmp_path)
    assert [f.path.name for f in found] == [
        "sam2.1_hiera_tiny.pt", "sam2.1_hiera_base_plus.pt", "sam2.1_hiera_large.pt",
        "sam2_hiera_tiny.pt", "sam2_hiera_small.pt", "my_finetune.pt"]
    configs = {f.path.name: f.config for f in found}
    assert configs["sam2.1_hiera_base_plus.pt"] == "configs/sam2.1/sam2.1_hiera_b+.yaml"
    assert configs["sam2_hiera_small.pt"] == "configs/sam2/sam2_hiera_s.yaml"
    assert configs["my_finetune.pt"] is None
    available = set(packaged_configs())
    for f in found:
        if f.config:
            assert f.config in available, f.config
    assert parse_name("sam2.1_hiera_b+.yaml") == ("sam2.1", "base_plus")
    assert parse_name("sam3_hiera_tiny.pt") is None


def test_resolve_prefers_setting_then_discovery(tmp_path):
    assert resolve_checkpoint(AppSettings(), folder=tmp_path / "absent") is None
    (tmp_path / "sam2_hiera_large.pt").write_bytes(b"x")
    (tmp_path / "sam2.1_hiera_small.pt").write_bytes(b"x")
    got = resolve_checkpoint(AppSettings(), folder=tmp_path)
    assert got.path.name == "sam2.1_hiera_small.pt" and got.source == "discovered"
    # a configured config picks the discovered checkpoint made for it
    got = resolve_checkpoint(AppSettings(sam2_config="configs/sam2/sam2_hiera_l.yaml"), folder=tmp_path)
    assert got.path.name == "sam2_hiera_large.pt" and got.config == "configs/sam2/sam2_hiera_l.yaml"
    # a configured path wins and is reported even when the file is missing
    got = resolve_checkpoint(AppSettings(sam2_checkpoint=str(tmp_path / "gone.pt"),
                                         sam2_config="sam2.1_hiera_t.yaml"), folder=tmp_path)
    assert got.source == "setting" and not got.exists and got.config == "sam2.1_hiera_t.yaml"



def test_the_app_looks_where_kiln_models_fetch_puts_files(tmp_path, monkeypatch):
    """KILN_MODELS_DIR is one folder for ``kiln models fetch``, the app and the doctor."""
    from app.segment.segment import choose_segmenter
    from kiln.checkpoints import models_dir

    monkeypatch.setenv("KILN_MODELS_DIR", str(tmp_path / "models"))
    assert models_dir() == tmp_path / "models"
    assert resolve_checkpoint(AppSettings()) is None
    assert str(tmp_path / "models") in choose_segmenter(AppSettings()).reason   # says where it looked
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "sam2.1_hiera_tiny.pt").write_bytes(b"x")
    got = resolve_checkpoint(AppSettings())
    assert got.path == tmp_path / "models" / "sam2.1_hiera_tiny.pt" and got.source == "discovered"
    monkeypatch.delenv("KILN_MODELS_DIR")
    assert models_dir() == Path("checkpoints")

# -- loading through the real loader -----------------------------------------------

def _trap_cuda(monkeypatch):
    """Pretend to be a GPU machine on which any CUDA initialisation fails: sam2
    builds parts of a model on "cuda" whenever CUDA is available."""
    def boom(*a, **k):
        raise AssertionError("CUDA initialised in the app process")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "_lazy_init", boom)


def test_sam2_builder_alone_would_touch_cuda(monkeypatch):
    """Control for the test below: without Kiln's guard, sam2 initialises CUDA
    while building a CPU model on a machine where CUDA is available."""
    from sam2.build_sam import build_sam2

    _trap_cuda(monkeypatch)
    with pytest.raises(Exception) as e:  # hydra wraps it in an InstantiationException
        build_sam2(TINY, ckpt_path=None, device="cpu")
    assert "CUDA initialised" in str(e.value) + str(e.value.__cause__)


def test_discover_load_and_predict_without_cuda(tiny_ckpt, monkeypatch):
    path, sd = tiny_ckpt
    _trap_cuda(monkeypatch)
    info = resolve_checkpoint(AppSettings(), folder=path.parent)
    assert info is not None and info.path == path and info.config == TINY
    predictor = load_predictor(info)
    assert torch.cuda.is_available() is True  # the loader restored what it patched
    loaded = predictor.model.state_dict()
    assert set(loaded) == set(sd)
    for k in ("image_encoder.trunk.patch_embed.proj.weight", "sam_mask_decoder.iou_token.weight"):
        assert torch.equal(loaded[k], sd[k]), k
    assert {p.device.type for p in predictor.model.parameters()} == {"cpu"}

    predictor.set_image(_image())
    masks, scores, logits = predictor.predict(point_coords=np.array([[32.0, 24.0]]),
                                              point_labels=np.array([1]), multimask_output=False)
    assert masks.shape == (1, 48, 64)
    assert scores.shape == (1,) and logits.shape == (1, 256, 256)
    assert np.isfinite(logits).all()


def test_missing_file_is_a_clear_error(tmp_path):
    info = resolve_checkpoint(AppSettings(sam2_checkpoint=str(tmp_path / "sam2.1_hiera_tiny.pt")))
    with pytest.raises(Sam2LoadError, match="does not exist"):
        load_predictor(info)


@pytest.mark.parametrize("kind", ["garbage", "truncated", "empty", "no_model_key"])
def test_corrupt_checkpoint_is_a_clear_error(tiny_ckpt, tmp_path, kind):
    path, _ = tiny_ckpt
    bad = tmp_path / "sam2.1_hiera_tiny.pt"
    if kind == "garbage":
        bad.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    elif kind == "truncated":
        with open(path, "rb") as f:
            bad.write_bytes(f.read(path.stat().st_size // 3))
    elif kind == "empty":
        bad.write_bytes(b"")
    else:
        torch.save({"state_dict": {"w": torch.zeros(2)}}, bad)
    info = resolve_checkpoint(AppSettings(), folder=tmp_path)
    expected = {"garbage": "cannot be read", "truncated": "cannot be read", "empty": "empty",
                "no_model_key": "no 'model' state dict"}[kind]
    with pytest.raises(Sam2LoadError, match=expected):
        load_predictor(info)


def test_config_mismatch_names_the_right_config(tiny_ckpt, tmp_path):
    path, sd = tiny_ckpt
    assert describe_state_dict(sd) == ("sam2.1", "tiny")
    info = resolve_checkpoint(AppSettings(sam2_checkpoint=str(path), sam2_config=SMALL))
    with pytest.raises(Sam2LoadError) as e:
        load_predictor(info)
    msg = str(e.value)
    assert "does not match model config " + SMALL in msg
    assert "missing" in msg and TINY in msg

    # same names, other shapes: a sam2.1 tiny file renamed to look like base_plus
    renamed = tmp_path / "sam2.1_hiera_base_plus.pt"
    shutil.copyfile(path, renamed)
    with pytest.raises(Sam2LoadError, match="shapes|missing|unexpected"):
        load_predictor(resolve_checkpoint(AppSettings(), folder=tmp_path))


def test_unknown_name_needs_a_config(tiny_ckpt, tmp_path):
    path, _ = tiny_ckpt
    odd = tmp_path / "finetuned.pt"
    odd.symlink_to(path)
    with pytest.raises(Sam2LoadError, match="app.sam2_config"):
        load_predictor(resolve_checkpoint(AppSettings(sam2_checkpoint=str(odd))))
    with pytest.raises(Sam2LoadError, match="not one of the sam2 package's configs"):
        load_predictor(resolve_checkpoint(AppSettings(sam2_checkpoint=str(odd), sam2_config="hiera_x.yaml")))
    predictor = load_predictor(resolve_checkpoint(AppSettings(sam2_checkpoint=str(odd),
                                                              sam2_config="sam2.1_hiera_t.yaml")))
    assert predictor.model.image_size == 1024


# -- GPU machines only ----------------------------------------------------------------

NO_CUDA = "needs a CUDA GPU; this machine has none"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
def test_no_cuda_context_after_loading_on_a_real_gpu(tiny_ckpt):
    """In a fresh process (as the app is), loading and predicting leaves CUDA uninitialised."""
    import subprocess
    import sys

    path, _ = tiny_ckpt
    code = (
        "import numpy as np, torch\n"
        "from app.segment.sam2_model import load_predictor\n"
        "from kiln.checkpoints import info_for\n"
        f"p = load_predictor(info_for({str(path)!r}))\n"
        "p.set_image(np.zeros((48, 64, 3), np.uint8))\n"
        "p.predict(point_coords=np.array([[32.0, 24.0]]), point_labels=np.array([1]))\n"
        "print('initialized', torch.cuda.is_initialized())\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).resolve().parent.parent)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "initialized False" in res.stdout


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
def test_sam2_on_cuda_matches_cpu(tiny_ckpt):
    """The same checkpoint on CUDA (as a worker could run it) gives the CPU's mask logits.

    Both sides come from Kiln's loader: sam2's build_sam2 applies its post-processing
    overrides (a single mask falls back to multimask when unstable), which a bare hydra instantiate
    lacks; on an H200 that bare model gave logits correlated 0.10 with the loader's, on CUDA
    and on CPU alike, which said nothing about CUDA."""
    path, _ = tiny_ckpt
    from sam2.sam2_image_predictor import SAM2ImagePredictor

    info = resolve_checkpoint(AppSettings(), folder=path.parent)
    cpu = load_predictor(info)
    gpu = SAM2ImagePredictor(load_predictor(info).model.to("cuda").eval())
    outs = []
    for p in (cpu, gpu):
        p.set_image(_image())
        _, _, logits = p.predict(point_coords=np.array([[32.0, 24.0]]), point_labels=np.array([1]),
                                 multimask_output=False)
        outs.append(logits.ravel())
    corr = np.corrcoef(outs[0], outs[1])[0, 1]
    assert corr > 0.99, corr


def test_box_prompt_reaches_sam2_and_bounds_the_mask(tiny_ckpt, monkeypatch):
    """The page's dragged box goes to SAM2 as its box prompt (with the clicks, when there
    are some), and nothing outside the box is ever selected."""
    from app.segment.segment import Sam2Segmenter

    path, _ = tiny_ckpt
    _trap_cuda(monkeypatch)
    info = resolve_checkpoint(AppSettings(), folder=path.parent)
    predictor = load_predictor(info)
    asked = []
    real_predict = predictor.predict

    def spy(**kw):
        asked.append(kw)
        return real_predict(**kw)

    predictor.predict = spy
    seg = Sam2Segmenter(predictor, info.label)
    rgb = _image()
    box = (18.0, 10.0, 46.0, 38.0)
    outside = np.ones(rgb.shape[:2], bool)
    outside[10:39, 18:47] = False

    mask = seg.segment(rgb, [], box)
    kw = asked[-1]
    np.testing.assert_array_equal(kw["box"], np.asarray(box, np.float32))
    assert kw["point_coords"] is None and kw["multimask_output"] is False
    assert mask.shape == rgb.shape[:2] and mask.dtype == bool and not mask[outside].any()

    mask = seg.segment(rgb, [(30.0, 20.0, 1), (5.0, 5.0, 0)], box)
    kw = asked[-1]
    np.testing.assert_array_equal(kw["box"], np.asarray(box, np.float32))
    np.testing.assert_array_equal(np.asarray(kw["point_coords"], float), [[30.0, 20.0], [5.0, 5.0]])
    np.testing.assert_array_equal(np.asarray(kw["point_labels"]), [1, 0])
    assert not mask[outside].any()


def test_selftest_twin_segments_through_the_loader_on_cpu(tiny_ckpt):
    """The selftest's SAM2 twin runs the same code on both devices; on CPU here. (Its first
    version set the predictor's device, which sam2 1.1.0 has no setter for: it failed on the
    first GPU machine.)"""
    from app.segment.sam2_selftest import segment_click
    from kiln.examples import draw_object

    path, _ = tiny_ckpt
    rgb, mask = draw_object(256, kind="toy", seed=1)
    ys, xs = np.nonzero(mask)
    click = np.array([[xs[len(xs) // 2], ys[len(ys) // 2]]], np.float32)
    info = resolve_checkpoint(AppSettings(), folder=path.parent)
    a, _ = segment_click(info, rgb, click, "cpu")
    b, _ = segment_click(info, rgb, click, "cpu")
    assert a.shape == mask.shape and a.dtype == bool and a.any()
    assert (a == b).all()
