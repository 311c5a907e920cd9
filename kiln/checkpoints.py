"""Finding SAM2 checkpoints and the model config each one needs.

Pure Python (no torch, no sam2 import) so that ``kiln doctor``, the CLI and the
app can all list checkpoints cheaply; loading lives in ``app/segment/sam2_model.py``.

Official file names (facebookresearch/sam2 releases, Hugging Face repos
``facebook/sam2[.1]-hiera-*``) map to the configs packaged inside ``sam2``:

    sam2.1_hiera_tiny.pt       -> configs/sam2.1/sam2.1_hiera_t.yaml
    sam2.1_hiera_small.pt      -> configs/sam2.1/sam2.1_hiera_s.yaml
    sam2.1_hiera_base_plus.pt  -> configs/sam2.1/sam2.1_hiera_b+.yaml
    sam2.1_hiera_large.pt      -> configs/sam2.1/sam2.1_hiera_l.yaml
    sam2_hiera_{tiny,...}.pt   -> configs/sam2/sam2_hiera_{t,...}.yaml
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Optional

DEFAULT_FOLDER = "checkpoints"
MODELS_DIR_ENV = "KILN_MODELS_DIR"


def models_dir(env: Optional[Mapping[str, str]] = None) -> Path:
    """The one folder model files live in: ``$KILN_MODELS_DIR``, else ``checkpoints/``
    (relative to where Kiln runs). ``kiln models fetch`` downloads there and the app, the
    self-test and ``kiln doctor`` look for SAM 2 checkpoints there."""
    import os

    env = os.environ if env is None else env
    return Path(env.get(MODELS_DIR_ENV) or DEFAULT_FOLDER).expanduser()

FAMILIES = ("sam2.1", "sam2")
# fastest first: segmentation runs on the app's CPU, where the embedding of the
# large model takes ~10x as long as tiny's and the mask decoder is the same
SIZES = ("tiny", "small", "base_plus", "large")
_SIZE_TAG = {"tiny": "t", "small": "s", "base_plus": "b+", "large": "l"}
_SIZE_ALIASES = {"tiny": "tiny", "t": "tiny", "small": "small", "s": "small",
                 "base_plus": "base_plus", "b+": "base_plus", "base-plus": "base_plus",
                 "large": "large", "l": "large"}

# sam2.1_hiera_tiny.pt, sam2_hiera_b+.pt, sam2.1-hiera-large.pt, sam2.1_hiera_small (1).pt
_NAME_RE = re.compile(r"^(sam2(?:\.1)?)[_-]hiera[_-](base[_-]plus|b\+|tiny|small|large|t|s|l)(?![a-z0-9])",
                      re.IGNORECASE)


def config_name(family: str, size: str) -> str:
    """Hydra config name inside the sam2 package, e.g. configs/sam2.1/sam2.1_hiera_t.yaml."""
    return f"configs/{family}/{family}_hiera_{_SIZE_TAG[size]}.yaml"


def parse_name(filename: str) -> Optional[tuple[str, str]]:
    """(family, size) from a checkpoint or config file name, or None when unrecognised."""
    m = _NAME_RE.match(Path(filename).name)
    if not m:
        return None
    return m.group(1).lower(), _SIZE_ALIASES[m.group(2).lower().replace("-", "_")]


@dataclass(frozen=True)
class CheckpointInfo:
    """One SAM2 checkpoint and the model config it is meant for.

    path:   the .pt file (may not exist when it came from a setting)
    config: sam2 hydra config name, None when neither the name nor a setting says
    family: "sam2.1" | "sam2" | None; size: "tiny" | "small" | "base_plus" | "large" | None
    source: "setting" (app.sam2_checkpoint) or "discovered" (found in the folder)
    """

    path: Path
    config: Optional[str]
    family: Optional[str] = None
    size: Optional[str] = None
    source: str = "discovered"

    @property
    def exists(self) -> bool:
        return self.path.is_file()

    @property
    def label(self) -> str:
        what = f"{self.family} {self.size}" if self.family else "unknown model"
        return f"{what} ({self.path.name})"

    def to_dict(self) -> dict:
        return {"path": str(self.path), "config": self.config, "family": self.family,
                "size": self.size, "source": self.source, "exists": self.exists,
                "bytes": self.path.stat().st_size if self.exists else None}


def info_for(path: str | Path, config: str = "", source: str = "discovered") -> CheckpointInfo:
    """CheckpointInfo for a file; ``config`` (a setting) wins over what the name says."""
    path = Path(path).expanduser()
    parsed = parse_name(path.name)
    family, size = parsed if parsed else (None, None)
    cfg: Optional[str]
    if config:
        cfg = config
        # the configured config decides which model is built, so describe that one
        parsed_cfg = parse_name(Path(config).name)
        if parsed_cfg:
            family, size = parsed_cfg
    else:
        cfg = config_name(*parsed) if parsed else None
    return CheckpointInfo(path=path, config=cfg, family=family, size=size, source=source)


def _order(info: CheckpointInfo) -> tuple:
    fam = FAMILIES.index(info.family) if info.family in FAMILIES else len(FAMILIES)
    size = SIZES.index(info.size) if info.size in SIZES else len(SIZES)
    return (info.config is None, fam, size, info.path.name)


def find_checkpoints(folder: Optional[str | Path] = None) -> list[CheckpointInfo]:
    """Every ``*.pt`` file directly in ``folder``, recognised ones first.

    Order: sam2.1 before sam2, then tiny, small, base_plus, large; files whose
    name says nothing about the model come last with ``config=None``.
    A missing folder gives an empty list. Default folder: ``models_dir()``.
    """
    folder = Path(models_dir() if folder is None else folder).expanduser()
    if not folder.is_dir():
        return []
    found = [info_for(p) for p in folder.iterdir() if p.suffix.lower() == ".pt" and p.is_file()]
    return sorted(found, key=_order)


def resolve_checkpoint(app_settings: Any, folder: Optional[str | Path] = None) -> Optional[CheckpointInfo]:
    """The checkpoint the app should use, or None (then segmentation uses GrabCut).

    ``app_settings`` is a ``kiln.settings.AppSettings`` (anything with
    ``sam2_checkpoint`` and ``sam2_config``). A configured path is returned even
    when the file is missing, so the caller can say so instead of silently
    falling back. Otherwise the first recognised checkpoint in ``folder`` (default
    ``models_dir()``) is
    used, preferring one whose config equals ``app.sam2_config`` when that is set.
    """
    ckpt = (getattr(app_settings, "sam2_checkpoint", "") or "").strip()
    cfg = (getattr(app_settings, "sam2_config", "") or "").strip()
    if ckpt:
        return info_for(ckpt, cfg, source="setting")
    usable = [c for c in find_checkpoints(folder) if c.config is not None or cfg]
    if not usable:
        return None
    if cfg:
        matching = [c for c in usable if c.config == cfg or (c.config and Path(c.config).name == Path(cfg).name)]
        chosen = matching[0] if matching else usable[0]
        return info_for(chosen.path, cfg, source="discovered")
    return replace(usable[0], source="discovered")
