"""Example images for the UI, drawn by Kiln itself (``kiln.examples``) on first start.

No third-party picture is shipped: the examples are generated into
``var/examples`` (or another folder) and regenerated only when missing.
"""

from __future__ import annotations

from pathlib import Path

# (file, caption) in the order the UI lists them; the mask file is for the CLI/tests only
EXAMPLES = (
    ("toy.png", "transparent PNG: its alpha is the mask"),
    ("toy_rgb.png", "opaque photo: Find the object or click it"),
    ("pebble.png", "transparent PNG, flat shape"),
)


# bumped when the drawings change, so a server's older copies are drawn again (2: the
# opaque toy on a studio backdrop, which "Find the object" selects, not on clutter)
VERSION = "2"


def ensure_examples(folder: str | Path = "var/examples") -> list[Path]:
    """Write the example images into ``folder`` unless all are there in this ``VERSION``;
    return their paths."""
    from kiln.examples import write_examples

    folder = Path(folder)
    paths = [folder / name for name, _ in EXAMPLES]
    marker = folder / "VERSION"
    current = marker.is_file() and marker.read_text().strip() == VERSION
    if not current or not all(p.is_file() and p.stat().st_size > 0 for p in paths):
        write_examples(folder)
        marker.write_text(VERSION + "\n")
    return paths
