"""What ``kiln run`` is given: which images, which masks, where the GLBs go, and whether
all of it can be used, decided before any worker starts.

``plan`` pairs images with masks and output paths; ``load`` reads one pair completely
(image, mask by the rule in ``kiln.maskfile``, the reconstruction stage's own input
checks) so a bad input is refused in seconds, not after a worker's start-up;
``check_space`` refuses to start on a disk that cannot hold a job, and ``writing_to``
turns a full disk met later into "no space left on <path>".

``--mask auto`` asks for the object to be found automatically in an image that has no
mask file and no transparency. Finding it is the front end's work (``app.segment``, which
this layer may not import), so ``load`` takes it as a ``FindMask`` callable; the mask it
answers is then checked here like any other.
"""

from __future__ import annotations

import errno
import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Optional

if TYPE_CHECKING:   # numpy stays out of `kiln --help`
    import numpy as np

    from kiln.settings import ReconstructSettings

# Extensions looked for in --mask-dir, in this order.
MASK_EXTS = (".png", ".webp", ".tif", ".tiff", ".bmp", ".gif", ".jpg", ".jpeg")
# Names a mask of IMAGE may have in --mask-dir, in this order ({stem} = IMAGE's name without extension).
MASK_NAMES = ("{stem}", "{stem}_mask", "{stem}-mask", "{stem}.mask")
# --mask's value that asks for the object to be found automatically
AUTO = "auto"

# finds the object of an image: (rgb (H, W, 3) uint8, the image's path) -> (mask (H, W) bool,
# a note for the person saying how it was found); raises InputProblem when it cannot
FindMask = Callable[["np.ndarray", Path], "tuple[np.ndarray, str]"]


class InputProblem(ValueError):
    """An input cannot be used; the message names the file and says why."""


class NoSpace(OSError):
    """A file system is (nearly) full; the message names the place."""

    def __init__(self, message: str):
        super().__init__(errno.ENOSPC, message)
        self.message = message

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class RunItem:
    image: Path
    mask: Path | None     # None: the image's own transparency is the mask
    output: Path          # the .glb to write
    auto: bool = False    # no mask file and no transparency: find the object (--mask auto)


@dataclass
class Loaded:
    rgb: np.ndarray       # (H, W, 3) uint8
    mask: np.ndarray      # (H, W) bool
    notes: list[str] = field(default_factory=list)   # how the mask was read, for the person
    found: bool = False   # the mask was found automatically (--mask auto), not read


def _find_mask(image: Path, mask_dir: Path) -> Path | None:
    same = image.resolve()
    for pattern in MASK_NAMES:
        for ext in MASK_EXTS:
            for cand in (mask_dir / (pattern.format(stem=image.stem) + ext),
                         mask_dir / (pattern.format(stem=image.stem) + ext.upper())):
                if cand.is_file() and cand.resolve() != same:
                    return cand
    return None


def plan(images: list[str], mask: str | None, mask_dir: str | None,
         output: str | None) -> tuple[list[RunItem], bool]:
    """(items, batch). Batch mode: several images or ``--mask-dir``; then ``output`` is a
    folder (default: here) that gets ``<image name>.glb`` for each image. ``mask`` may be
    ``AUTO``: every image without a mask file (in ``mask_dir``) or transparency gets the
    object found automatically."""
    paths = [Path(p) for p in images]
    batch = len(paths) > 1 or mask_dir is not None
    auto = mask == AUTO
    if not batch:
        image = paths[0]
        if output is None:
            out = Path(image.stem + ".glb")
        elif output.endswith(("/", os.sep)) or Path(output).is_dir():
            out = Path(output) / (image.stem + ".glb")
        else:
            out = Path(output)
        if out.suffix.lower() != ".glb":
            raise InputProblem(f"output {out} must end in .glb (or name a folder)")
        return [RunItem(image, Path(mask) if mask and not auto else None, out, auto)], False

    if mask and not auto:
        raise InputProblem("--mask names the mask of one image; with several images put the "
                           "masks in a folder and pass --mask-dir FOLDER (or --mask auto to find "
                           "each object automatically)")
    out_dir = Path(output or ".")
    if out_dir.suffix.lower() == ".glb":
        raise InputProblem(f"with several images (or --mask-dir) -o names a folder, not {out_dir}")
    if out_dir.exists() and not out_dir.is_dir():
        raise InputProblem(f"-o {out_dir} is a file; with several images it must name a folder")
    mdir = Path(mask_dir) if mask_dir else None
    if mdir is not None and not mdir.is_dir():
        raise InputProblem(f"--mask-dir {mdir} is not a folder")
    items: list[RunItem] = []
    by_output: dict[Path, Path] = {}
    for image in paths:
        out = out_dir / (image.stem + ".glb")
        if out in by_output:
            raise InputProblem(f"{by_output[out]} and {image} would both be written to {out}; "
                               "rename one of them")
        by_output[out] = image
        items.append(RunItem(image, _find_mask(image, mdir) if mdir else None, out, auto))
    return items, True


def _mask_names(image: Path) -> str:
    return ", ".join(p.format(stem=image.stem) + ".png" for p in MASK_NAMES)


def load(item: RunItem, max_pixels: int, reconstruct: "ReconstructSettings",
         mask_dir: str | None = None, find_mask: Optional[FindMask] = None) -> Loaded:
    """Read an item completely and run the reconstruction stage's own input checks.
    ``find_mask`` finds the object of an ``item.auto`` image that has no transparency.
    Raises ``InputProblem``."""
    loaded = read_photo(item.image, item.mask, max_pixels, mask_dir,
                        find_mask=find_mask if item.auto else None, auto_hint=True)
    what = (f"mask {item.mask}" if item.mask is not None
            else f"the mask of {item.image}" if loaded.found else f"the transparency of {item.image}")
    check_reconstructable(loaded.rgb, loaded.mask, reconstruct, what)
    return loaded


def read_photo(image: Path, mask: Path | None, max_pixels: int, mask_dir: str | None = None,
               flag: str = "--mask", find_mask: Optional[FindMask] = None,
               auto_hint: bool = False) -> Loaded:
    """A photo and its mask (``mask``, else the photo's own transparency, else what
    ``find_mask`` finds), read by the rule in ``kiln.maskfile`` and checked for size and
    usable coverage. Raises ``InputProblem``; ``flag`` is the option that gives the mask,
    for the hint, and ``auto_hint`` adds that ``{flag} auto`` finds the object."""
    from kiln.imageio import ImageError, load_image
    from kiln.limits import image_size_problem, mask_problem
    from kiln.maskfile import load_mask, read_alpha

    try:
        rgb, alpha = load_image(image, max_pixels=max_pixels)
    except ImageError as e:
        raise InputProblem(f"image {image}: {e}") from None
    h, w = rgb.shape[:2]
    small = image_size_problem(w, h, f"image {image}")
    if small:
        raise InputProblem(small)
    notes = []
    if mask is not None:
        what = f"mask {mask}"
        try:
            reading = load_mask(mask, max_pixels=max_pixels)
        except ImageError as e:
            raise InputProblem(f"{what}: {e}") from None
        mh, mw = reading.mask.shape
        if (mh, mw) != (h, w):
            raise InputProblem(f"{what} is {mw}x{mh} but the image {image} is {w}x{h}; "
                               "they must match")
    elif alpha is None and find_mask is not None:
        found, note = find_mask(rgb, image)
        if found.shape != (h, w) or found.dtype != bool:
            raise InputProblem(f"the object found in {image} came back as a {found.dtype} array "
                               f"of shape {found.shape}, not ({h}, {w}) bool")
        problem = mask_problem(found)
        if problem is not None:
            raise InputProblem(f"the mask found automatically in {image} {problem}; pass "
                               f"{flag} MASK.png (white = object)")
        return Loaded(rgb=rgb, mask=found, notes=[note], found=True)
    else:
        what = f"the transparency of {image}"
        if alpha is None:
            where = (f" and {mask_dir} holds no mask for it (looked for {_mask_names(image)}, "
                     "any image type)") if mask_dir else ""
            hint = ("put its mask in the --mask-dir folder" if mask_dir
                    else f"pass {flag} MASK.png (white = object)")
            if auto_hint:
                hint += (f", pass {flag} auto to find the object automatically," if mask_dir
                         else f" or {flag} auto (to find the object automatically),")
            raise InputProblem(f"no mask: {image} has no transparency{where}, so the object "
                               f"cannot be told from the background; {hint} or use a "
                               "transparent PNG")
        reading = read_alpha(alpha)
    notes.append(reading.describe(what))
    by = "alpha (opaque = object)" if reading.channel == "alpha" else "grey level (white = object)"
    problem = mask_problem(reading.mask)
    if problem is not None:
        hint = " (is it inverted?)" if reading.mask.all() else ""
        raise InputProblem(f"{what} {problem}, read by its {by}{hint}")
    return Loaded(rgb=rgb, mask=reading.mask, notes=notes)


def check_reconstructable(rgb: np.ndarray, mask: np.ndarray, reconstruct: "ReconstructSettings",
                          what: str = "the mask") -> None:
    """The checks the reconstruction stage starts with (empty or full mask, a speck, also
    after its downscale, and the backend's own: builtin refuses a mask too thin for its
    grid), run here so the worker is never started for them. InputProblem naming ``what``.
    The modules involved are light (numpy; cv2 for the downscale and the grid)."""
    from pipeline.recon.reconstruct import check_input
    from pipeline.types import ImageInput
    from pipeline.validate import StageInputError

    try:
        check_input(ImageInput(rgb=rgb, mask=mask), reconstruct)
    except StageInputError as e:
        raise InputProblem(f"{what}: {e}") from None


# --------------------------------------------------------------------------- disk space

def _existing(path: Path) -> Path:
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _mb(n: float) -> str:
    return f"{n / (1024 * 1024):.1f} MB"


def no_space(path: Path, need: int | None = None) -> NoSpace:
    """The error for a full file system at ``path`` (saying how much is free there)."""
    try:
        free = shutil.disk_usage(_existing(path)).free
        detail = f"{_mb(free)} free"
    except OSError:
        detail = ""
    if need is not None:
        detail += f"; a job needs about {_mb(need)}"
    return NoSpace(f"no space left on {path}" + (f" ({detail})" if detail else ""))


def job_bytes(pixels: int, texture_size: int | str) -> int:
    """A generous estimate of what one job writes to each place: its inputs as PNG
    (≤ 4 bytes per pixel with the mask), the GLB (texture + mesh) and room for the rest."""
    if texture_size == "auto":
        from kiln.settings import allowed_range

        size = int(allowed_range("bake.texture_size")[1])   # the largest size auto can choose
    else:
        size = int(texture_size)
    return 4 * pixels + 8 * size * size + 32 * 1024 * 1024


def check_space(places: list[Path], need: int) -> None:
    """Raise ``NoSpace`` when one of ``places`` (folders; they may not exist yet) has less
    than ``need`` bytes free."""
    for place in places:
        try:
            free = shutil.disk_usage(_existing(place)).free
        except OSError:
            continue   # cannot tell: the write itself will say
        if free < need:
            raise no_space(Path(place), need)


def is_no_space(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)


@contextmanager
def writing_to(path: Path) -> Iterator[None]:
    """Turn a full disk met while writing under ``path`` into ``NoSpace`` naming it
    (a failed write() names no file itself)."""
    try:
        yield
    except NoSpace:
        raise
    except OSError as e:
        if is_no_space(e):
            # a failed write() names no file; open() and mkdir() do
            raise no_space(Path(e.filename).parent if e.filename else Path(path)) from None
        raise
