"""The model files Kiln can use, where they go, and whether the copy on disk is right.

A catalogue, not a loader: ``kiln models list`` and ``kiln models fetch`` read it.
Sizes and sha256 sums are pinned only where they are known; a file without them
is fetched and then *recorded* (``NAME.sha256`` next to it) so later checks catch a
file that changed on disk, and is labelled "unverified" because nobody publishes
its checksum. Numbers are never guessed here.

Pure standard library, like the rest of ``kiln/``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from kiln.checkpoints import MODELS_DIR_ENV, models_dir  # noqa: F401  (their home; re-exported for the CLI)

SAM2_BASE_URL = "https://dl.fbaipublicfiles.com/segment_anything_2/092824"
UNVERIFIED_NOTE = ("unverified: no published checksum; its size and sha256 are recorded "
                   "(printed) after the first fetch")

# SAM 3D Objects' weights are gated on Hugging Face (an access request per account):
# Kiln never downloads them, it prints what its doc/setup.md says to run.
SAM3D_COMMANDS = (
    "# 1. request access at https://huggingface.co/facebook/sam-3d-objects, then log in:",
    "pip install 'huggingface-hub[cli]<1.0'",
    "hf auth login            # older huggingface-hub: huggingface-cli login",
    "# 2. in your sam-3d-objects checkout (its doc/setup.md):",
    "TAG=hf",
    "hf download --repo-type model --local-dir checkpoints/${TAG}-download --max-workers 1 facebook/sam-3d-objects",
    "mv checkpoints/${TAG}-download/checkpoints checkpoints/${TAG}",
    "rm -rf checkpoints/${TAG}-download",
    "# 3. point Kiln at it:",
    "kiln run photo.png --set reconstruct.backend=sam3d "
    "--set reconstruct.sam3d_config=/path/to/sam-3d-objects/checkpoints/hf/pipeline.yaml",
)


@dataclass(frozen=True)
class ModelFile:
    """One downloadable file.

    name:   what `kiln models fetch NAME` takes, also the file name on disk
    size, sha256: pinned values, or None when no trustworthy source gives them
    kind:   what it is for ("sam2" segmentation, "rembg" --mask auto, "sam3d" reconstruction)
    gated:  True when the host needs a per-user licence acceptance: never fetched
    """

    name: str
    url: str
    size: Optional[int]
    sha256: Optional[str]
    kind: str
    gated: bool = False
    note: str = ""

    @property
    def pinned(self) -> bool:
        return self.sha256 is not None


def _sam2(size: str, nbytes: Optional[int] = None, sha256: Optional[str] = None, note: str = "") -> ModelFile:
    name = f"sam2.1_hiera_{size}.pt"
    return ModelFile(name=name, url=f"{SAM2_BASE_URL}/{name}", size=nbytes, sha256=sha256, kind="sam2",
                     note=note or UNVERIFIED_NOTE)


# rembg's U^2-Net (``app.segment.rembg_auto`` loads it through rembg's "u2net_custom"
# session, which reads this file's layout: one RGB input at 320 x 320, the mask first).
# rembg's own source pins only its md5 (60024c5c889badc19c04ad937298a77b, in
# rembg/sessions/u2net.py); the size and sha256 below are pinned alike by several
# independent projects. Neither was checked against the real file here (no network).
REMBG_FILE = "u2net.onnx"
REMBG_URL = "https://github.com/danielgatis/rembg/releases/download/v0.0.0/u2net.onnx"

# tiny: 156,008,466 bytes and this sha256 are pinned alike by several independent
# projects (Meta publishes none). The others: see UNVERIFIED_NOTE.
CATALOGUE: tuple[ModelFile, ...] = (
    _sam2("tiny", 156_008_466, "7402e0d864fa82708a20fbd15bc84245c2f26dff0eb43a4b5b93452deb34be69",
          note="fastest on the app's CPU; the default choice"),
    _sam2("small"),
    _sam2("base_plus"),
    _sam2("large"),
    ModelFile(name=REMBG_FILE, url=REMBG_URL, size=175_997_641,
              sha256="8d10d2f3bb75ae3b6d527c77944fc5e7dcd94b29809d47a739a7a728a912b491", kind="rembg",
              note="rembg's U^2-Net for --mask auto (pip install 'kiln3d[rembg]'); size and sha256 as "
                   "independent projects pin them (rembg itself publishes an md5 only)"),
    ModelFile(name="sam-3d-objects", url="https://huggingface.co/facebook/sam-3d-objects", size=None,
              sha256=None, kind="sam3d", gated=True,
              note="gated on Hugging Face: Kiln does not fetch it; see the commands below"),
)

_ALIASES = {"tiny": "sam2.1_hiera_tiny.pt", "small": "sam2.1_hiera_small.pt",
            "base_plus": "sam2.1_hiera_base_plus.pt", "large": "sam2.1_hiera_large.pt",
            "sam3d": "sam-3d-objects", "rembg": REMBG_FILE, "u2net": REMBG_FILE}


def catalogue() -> tuple[ModelFile, ...]:
    """The catalogue (a function so tests can swap ``CATALOGUE`` for a loopback one)."""
    return CATALOGUE


def lookup(name: str) -> Optional[ModelFile]:
    """The entry called ``name``: its file name, the name without ``.pt`` or ``.onnx``, or a
    short alias (tiny, small, base_plus, large, rembg, sam3d)."""
    wanted = _ALIASES.get(name.lower(), name)
    for m in catalogue():
        if wanted in (m.name, short_name(m)):
            return m
    return None


def short_name(model: ModelFile) -> str:
    """The name without its extension, as ``kiln models fetch`` lists it."""
    return model.name.removesuffix(".pt").removesuffix(".onnx")


def rembg_model_path(folder: Optional[Path] = None) -> Path:
    """Where Kiln looks for rembg's model file: in ``models_dir()`` (or ``folder``), the one
    folder ``kiln models fetch`` writes to. rembg's own folder (~/.u2net) is not searched."""
    return Path(models_dir() if folder is None else folder).expanduser() / REMBG_FILE


def record_path(path: Path) -> Path:
    """The sidecar holding the sha256 and size recorded at an unpinned file's first fetch."""
    return path.with_name(path.name + ".sha256")


def sha256_of(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def write_record(path: Path, sha256: str, size: int) -> None:
    """``sha256sum``-style line plus the size, so `sha256sum -c` style tools can read it too."""
    record_path(path).write_text(f"{sha256}  {path.name}\n# size {size}\n")


def read_record(path: Path) -> Optional[tuple[str, int]]:
    """(sha256, size) recorded for ``path``, or None when there is no readable record."""
    try:
        lines = record_path(path).read_text().splitlines()
        sha = lines[0].split()[0]
        size = int(lines[1].split()[-1])
    except (OSError, IndexError, ValueError):
        return None
    return (sha, size) if len(sha) == 64 else None


@dataclass(frozen=True)
class Status:
    """What is on disk for one entry. state: "absent" | "partial" | "verified" | "recorded"
    (matches the record of its first fetch) | "unverified" | "corrupt"."""

    state: str
    path: Path
    detail: str = ""

    @property
    def usable(self) -> bool:
        """True when a fetch should skip the file."""
        return self.state in ("verified", "recorded", "unverified")


def status(model: ModelFile, folder: Path) -> Status:
    """Check the file in ``folder`` against the pinned (or recorded) size and sha256.

    Size first: a wrong size needs no hashing. Hashing a 150 MB file takes about a
    second, which ``kiln models list`` accepts to say "verified" honestly.
    """
    path = folder / model.name
    if not path.is_file():
        part = path.with_name(path.name + ".part")
        if part.is_file():
            return Status("partial", path, f"{part.stat().st_size:,} bytes in {part.name}: fetch resumes it")
        return Status("absent", path)
    size = path.stat().st_size
    want_size: Optional[int]
    if model.sha256 is not None:
        sha, want_size = model.sha256, model.size
    else:
        recorded = read_record(path)
        if recorded is None:
            return Status("unverified", path, f"{size:,} bytes; no published checksum and no record of a fetch")
        sha, want_size = recorded
    if want_size is not None and size != want_size:
        return Status("corrupt", path, f"{size:,} bytes, expected {want_size:,}: download again")
    got = sha256_of(path)
    if got != sha:
        return Status("corrupt", path, f"sha256 {got[:12]}... differs from {sha[:12]}...: download again")
    return Status("verified" if model.pinned else "recorded", path, f"{size:,} bytes")
