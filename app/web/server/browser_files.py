"""Files in Gradio's folder that belong to browsers: what a browser uploaded, and the image
of its working copy that the page shows (the canvas).

Gradio serves any file in its folder to whoever knows the path, and a path leaks as easily
as a result's URL (history, logs, a shared screen). So these files are served under the
rule results are (``results.ResultPublisher``): only to the browser they belong to
(``server.RequestGuard`` asks ``OwnedFiles.owners``), 403 for any other browser and for
clients without the cookie.

- An upload belongs to the browser that sent it: the guard grants the paths Gradio's upload
  route answers with before the answer leaves (``uploaded_paths``). Gradio names an
  upload's folder by its content, so two browsers that send the same bytes under the same
  name share one file, and both may fetch it.
- The canvas is written here (``publish_canvas``), not by Gradio, which would name it by its
  content alone in a folder everyone may read; a handler's image becomes a file of the
  caller's browser (``handlers_image.canvas_as_file``).

Files are known by their folder's name and their own (as ``ResultPublisher.owner`` knows
results), so every spelling of a path that Gradio would open finds its owners. A server
starts with Gradio's folder empty (``server.launch``): an upload from before a restart has
no owner to check against and would otherwise be anyone's.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import secrets
import threading
from pathlib import Path
from typing import Optional

import numpy as np

from kiln.atomic import atomic_write

from app.web.server.browser import browser_of

# owned files remembered before those whose file is gone are forgotten (Gradio's cache sweep
# deletes uploads and canvas images after a day)
PRUNE_AT = 10_000


def _key(path: str | Path) -> tuple[str, str]:
    p = Path(os.path.abspath(str(path)))
    return p.parent.name, p.name


def uploaded_paths(body: bytes) -> list[str]:
    """The file paths in the answer of Gradio's upload route (a JSON list of paths); [] for
    anything else."""
    try:
        data = json.loads(body)
    except ValueError:
        return []
    return [p for p in data if isinstance(p, str) and p] if isinstance(data, list) else []


class OwnedFiles:
    """``grant(path, browser)``: the browser (``browser.browser_id``) may fetch the file;
    ``owners(path)``: the browsers that may, or None for a file nobody was granted (left to
    Gradio's own rules). ``publish_canvas(session, pixels)``: the canvas as a file of the
    session's browser. Thread-safe."""

    def __init__(self, canvas_root: Path):
        self.canvas_root = Path(canvas_root)
        self._lock = threading.Lock()
        self._owners: dict[tuple[str, str], tuple[str, set[str]]] = {}
        self._prune_at = PRUNE_AT
        # canvas names are unguessable without it, even knowing the browser and the image
        self._salt = secrets.token_bytes(16)

    def grant(self, path: str | Path, browser: Optional[str]) -> None:
        """``browser`` may fetch the file at ``path``; None makes it a file nobody may fetch
        (a cookie-less session's)."""
        key = _key(path)
        with self._lock:
            entry = self._owners.setdefault(key, (os.path.abspath(str(path)), set()))
            if browser is not None:
                entry[1].add(browser)
            if len(self._owners) > self._prune_at:
                self._forget_gone()

    def _forget_gone(self) -> None:
        """Forget files that no longer exist; under the lock. The next pruning waits until
        the map has doubled, so a map of live files does not make every grant a sweep."""
        for key in [k for k, (p, _) in self._owners.items() if not os.path.exists(p)]:
            del self._owners[key]
        self._prune_at = max(PRUNE_AT, 2 * len(self._owners))

    def owners(self, path: str | Path) -> Optional[frozenset[str]]:
        with self._lock:
            entry = self._owners.get(_key(path))
        return frozenset(entry[1]) if entry is not None else None

    def publish_file(self, session: str, data: bytes, name: str) -> str:
        """``data`` as a file called ``name`` that only the session's browser may fetch (a
        script's fitted camera and its picture: ``/fit_camera``), in a folder named by a salted
        hash of the browser and the bytes, so the file keeps the name a client saves it as."""
        browser = browser_of(session)
        digest = hashlib.sha256(self._salt + (browser or session).encode() + data).hexdigest()[:32]
        path = self.canvas_root / digest / name
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, data, fsync=False)
        self.grant(path, browser)
        return str(path)

    def publish_canvas(self, session: str, pixels: np.ndarray) -> str:
        """``pixels`` ((h, w, 3) uint8) as a JPEG the session's browser may fetch, encoded as
        Gradio encodes a ``gr.Image(format="jpeg")`` value (PIL's defaults), so the page shows
        the same pixels. Named by a salted hash of the browser and the bytes: the same image
        for the same browser is one file, however often it is shown. A cookie-less session
        ('web-anon-…') gets a file nobody may fetch, as it gets no result."""
        from PIL import Image

        buf = io.BytesIO()
        Image.fromarray(np.ascontiguousarray(pixels, dtype=np.uint8)).save(buf, format="JPEG")
        data = buf.getvalue()
        browser = browser_of(session)
        digest = hashlib.sha256(self._salt + (browser or session).encode() + data).hexdigest()[:32]
        path = self.canvas_root / f"{digest}.jpeg"
        try:
            os.utime(path)   # Gradio's cache sweep ages files by their ctime: shown again, kept again
        except FileNotFoundError:
            atomic_write(path, data, fsync=False)
        self.grant(path, browser)
        return str(path)
