"""SAM2 image predictor for click-to-segment, loaded on the CPU of the app process.

The app process must never initialise CUDA (see DESIGN.md: SAM2 sharing a CUDA
context with nvdiffrast in the Gradio process is what crashed the old tool).
sam2 1.1.0 touches CUDA while *building* a model whenever
``torch.cuda.is_available()`` is true, even with ``device="cpu"``:
``PositionEmbeddingSine`` warms a cache on "cuda" and ``RoPEAttention`` moves
its frequencies to "cuda". ``load_predictor`` therefore builds the model with
``torch.cuda.is_available`` answering False; inference itself has no CUDA
calls. Nothing here imports ``pipeline/``.

Every failure to load raises ``Sam2LoadError`` with a message meant for the UI,
which then falls back to GrabCut and shows that message.
"""

from __future__ import annotations

import contextlib
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

from kiln.checkpoints import (  # noqa: F401  (re-exported for the app)
    DEFAULT_FOLDER,
    CheckpointInfo,
    config_name,
    find_checkpoints,
    models_dir,
    resolve_checkpoint,
)

if TYPE_CHECKING:  # pragma: no cover
    from sam2.sam2_image_predictor import SAM2ImagePredictor

__all__ = ["Sam2LoadError", "CheckpointInfo", "find_checkpoints", "resolve_checkpoint",
           "load_predictor", "packaged_configs", "describe_state_dict"]


class Sam2LoadError(RuntimeError):
    """The SAM2 checkpoint cannot be used. The message says why and what to do."""


def packaged_configs() -> list[str]:
    """Model config names shipped inside the installed sam2 package (hydra names)."""
    import importlib.util

    spec = importlib.util.find_spec("sam2")
    if spec is None or not spec.submodule_search_locations:
        return []
    root = Path(list(spec.submodule_search_locations)[0])
    return sorted(str(p.relative_to(root)) for p in (root / "configs").glob("sam2*/*.yaml")
                  if "training" not in p.parent.name)


def _resolve_config(config: str) -> str:
    """Accept the hydra name, a bare file name or a stem; return the hydra name."""
    available = packaged_configs()
    if config in available:
        return config
    stem = Path(config).name
    if not stem.endswith(".yaml"):
        stem += ".yaml"
    for name in available:
        if Path(name).name == stem:
            return name
    raise Sam2LoadError(f"SAM2 model config '{config}' is not one of the sam2 package's configs: "
                        + ", ".join(available))


@contextlib.contextmanager
def _cuda_hidden():
    """Make torch.cuda.is_available() answer False while sam2 builds its modules.

    Patching the function is process-wide for the duration; that is harmless
    here because nothing in the app process may use CUDA in the first place.
    """
    import torch

    original = torch.cuda.is_available
    torch.cuda.is_available = lambda: False
    try:
        yield
    finally:
        torch.cuda.is_available = original


def describe_state_dict(sd: dict) -> tuple[str, str] | None:
    """(family, size) of a SAM2 state dict from its shapes, or None if it is not one.

    Hiera trunks differ in block count and width: tiny 12 x 96, small 16 x 96,
    base_plus 24 x 112, large 48 x 144; SAM2.1 adds ``no_obj_embed_spatial``.
    """
    w = sd.get("image_encoder.trunk.patch_embed.proj.weight")
    if w is None or not hasattr(w, "shape"):
        return None
    blocks = {k.split(".")[3] for k in sd if k.startswith("image_encoder.trunk.blocks.")}
    size = {(12, 96): "tiny", (16, 96): "small", (24, 112): "base_plus",
            (48, 144): "large"}.get((len(blocks), int(w.shape[0])))
    if size is None:
        return None
    family = "sam2.1" if "no_obj_embed_spatial" in sd else "sam2"
    return family, size


def _read_state_dict(path: Path) -> dict:
    import torch

    if not path.exists():
        raise Sam2LoadError(f"SAM2 checkpoint {path} does not exist; put an official file such as "
                            f"sam2.1_hiera_tiny.pt into {models_dir()}/ (kiln models fetch tiny) or fix "
                            "app.sam2_checkpoint")
    if not path.is_file():
        raise Sam2LoadError(f"SAM2 checkpoint {path} is not a file")
    size = path.stat().st_size
    if size == 0:
        raise Sam2LoadError(f"SAM2 checkpoint {path} is empty (0 bytes); download it again")
    is_zip = zipfile.is_zipfile(path)
    try:
        # weights_only: a checkpoint is data, never code to execute
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=is_zip)
    except Exception as e:  # noqa: BLE001 - every reader error means the same to the user
        hint = ("it is not a zip archive, so it is truncated or not a PyTorch checkpoint"
                if not is_zip else "the archive is damaged")
        raise Sam2LoadError(f"SAM2 checkpoint {path} ({size} bytes) cannot be read: {hint}; "
                            f"download it again ({type(e).__name__}: {str(e)[:200]})") from None
    if not isinstance(obj, dict) or "model" not in obj or not isinstance(obj["model"], dict):
        keys = list(obj)[:5] if isinstance(obj, dict) else type(obj).__name__
        raise Sam2LoadError(f"SAM2 checkpoint {path} has no 'model' state dict (found {keys}); "
                            "it is not an official SAM2 checkpoint")
    return obj["model"]


def _check_match(sd: dict, model, path: Path, config: str) -> None:
    expected = model.state_dict()
    missing = [k for k in expected if k not in sd]
    unexpected = [k for k in sd if k not in expected]
    shapes = [k for k in expected if k in sd and tuple(getattr(sd[k], "shape", ())) != tuple(expected[k].shape)]
    if not (missing or unexpected or shapes):
        return
    parts = []
    if missing:
        parts.append(f"{len(missing)} weights missing (e.g. {missing[0]})")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected (e.g. {unexpected[0]})")
    if shapes:
        k = shapes[0]
        parts.append(f"{len(shapes)} with other shapes (e.g. {k}: {tuple(sd[k].shape)} vs "
                     f"{tuple(expected[k].shape)})")
    guess = describe_state_dict(sd)
    hint = (f"; the checkpoint looks like {guess[0]} {guess[1]}: set app.sam2_config to "
            f"{config_name(*guess)}" if guess else "")
    raise Sam2LoadError(f"SAM2 checkpoint {path.name} does not match model config {config}: "
                        + ", ".join(parts) + hint)


def load_predictor(info: CheckpointInfo) -> "SAM2ImagePredictor":
    """Build the model from ``info.config``, load ``info.path`` into it, on CPU.

    Returns a ``sam2.sam2_image_predictor.SAM2ImagePredictor`` in eval mode.
    Raises ``Sam2LoadError`` when sam2 is not installed, the file is missing,
    empty, truncated or not a checkpoint, the config is unknown, or the weights
    do not fit the config (names or shapes).
    """
    path = Path(info.path)
    try:
        import torch  # noqa: F401
        import sam2  # noqa: F401  (initialises sam2's hydra config search path)
        from sam2.build_sam import build_sam2
        from sam2.sam2_image_predictor import SAM2ImagePredictor
    except ImportError as e:
        raise Sam2LoadError(f"the sam2 package is not installed ({e}); install it with "
                            "SAM2_BUILD_CUDA=0 pip install --no-build-isolation sam2==1.1.0") from None
    if not info.config:
        raise Sam2LoadError(f"cannot tell which SAM2 model {path.name} is from its name; set "
                            "app.sam2_config (e.g. configs/sam2.1/sam2.1_hiera_t.yaml) or use the "
                            "official file name (e.g. sam2.1_hiera_tiny.pt)")
    config = _resolve_config(info.config)
    sd = _read_state_dict(path)
    try:
        with _cuda_hidden():
            # weights are loaded below, with our own checks, instead of by build_sam2
            model = build_sam2(config, ckpt_path=None, device="cpu", mode="eval")
    except Exception as e:  # noqa: BLE001
        raise Sam2LoadError(f"building SAM2 model {config} failed: {type(e).__name__}: {e}") from None
    _check_match(sd, model, path, config)
    model.load_state_dict(sd, strict=True)
    model.eval()
    return SAM2ImagePredictor(model)
