"""Publishing finished outputs where the browser downloads them, owned by the browser that
made them."""

from __future__ import annotations

import re
import secrets
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Optional

from kiln.formats import OUTPUT_TAIL, base_key, copy_output, output_name

from app.web.server.browser import browser_of, same_browser
from app.web.server.usertext import UIError

# What the server's file guard treats as a result: any name a job's output can have
# (``kiln.formats.OUTPUT_TAIL``: .glb, .ply, .mesh.ply, .obj.zip, .stl), wherever it lies.
# Each is served only when ``ResultPublisher.owner`` names the requesting browser, so a
# result this server did not publish (or published for someone else) is never served.
RESULT_NAME_RE = re.compile(r"[^/\\]+\.(glb|ply|stl|zip)", re.IGNORECASE)
_STEM_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


class ResultPublisher:
    """Copies a browser's finished outputs into Gradio's own file folder, so the browser
    downloads them from there and the job store itself is never served.

    Layout: ``<root>/<random 128-bit folder per browser>/<image-name>-<n>.glb`` (and .ply,
    .obj.zip, .stl, .mesh.ply: ``kiln.formats.OUTPUT_TAIL``). The
    file's own name is what a browser saves it as (Gradio's download buttons and file
    lists use it), so it carries the image's name; the folder's random name keeps one
    browser's ``horse-1.glb`` apart from another's and unguessable. A cookie-less tab
    ('web-anon-…') gets a folder of its own. Copies are made once per (job, name)."""

    def __init__(self, root: Path, prune_age_s: float = 86400.0):
        self.root = Path(root)
        self._prune(prune_age_s)
        self._lock = threading.Lock()
        self._tokens: dict[str, str] = {}
        self._done: dict[tuple[str, str, str], dict[str, Path]] = {}
        # (folder name, file name) -> (job id, session of the job)
        self._owners: dict[tuple[str, str], tuple[str, str]] = {}
        # job id -> when (monotonic) a page last had its outputs published: it is on show
        self._shown: dict[str, float] = {}

    def _prune(self, age_s: float) -> None:
        """Drop folders older than ``age_s``: folders do not outlive a server (the next one
        draws new names), and every published file is only a copy of a job output."""
        if not self.root.is_dir():
            return
        cutoff = time.time() - age_s
        for d in self.root.iterdir():
            try:
                if d.is_dir() and d.stat().st_mtime < cutoff:
                    shutil.rmtree(d, ignore_errors=True)
            except OSError:
                continue

    def _folder(self, session: str) -> Path:
        key = browser_of(session) or session
        with self._lock:
            tok = self._tokens.setdefault(key, secrets.token_hex(16))
        return self.root / tok

    def publish(self, session: str, st: Any, stem: Optional[str] = None) -> dict[str, Path]:
        """{'glb': path, 'ply': path, 'obj': path, ...} copies of a done job's outputs (by output
        key, ``kiln.formats``) named ``<stem><tail>`` ('horse-1.glb', 'horse-1.obj.zip')
        (``history.result_stems``: '<image-name>-<n>'; 'kiln-<job>' without one); {} for a
        job that is not done.

        Refuses jobs of other browsers: a tab only ever gets its own browser's files.
        """
        if st is None or st.state != "done" or not st.outputs:
            return {}
        if not same_browser(session, st.session):
            raise UIError("that result belongs to another browser session")
        stem = stem if stem and _STEM_RE.fullmatch(stem) else f"kiln-{st.id}"
        dest = self._folder(session)
        key = (dest.name, st.id, stem)
        with self._lock:
            if key in self._done and all(p.exists() for p in self._done[key].values()):
                self._shown[st.id] = time.monotonic()   # shown again: on show as much as the first time
                return dict(self._done[key])
        dest.mkdir(parents=True, exist_ok=True)
        out = {}
        for kind, src in sorted(st.outputs.items()):
            src = Path(src)
            # a scene's files are one per object (``obj@bench``: '<stem>.bench.obj.zip')
            if base_key(kind) not in OUTPUT_TAIL or not src.is_file():
                continue
            name = output_name(stem, kind)
            with self._lock:
                taken = self._owners.get((dest.name, name))
                if taken is not None and taken[0] != st.id:
                    # the name went to another job first (its stem was counted differently):
                    # never overwrite it, never hand this job's bytes out under it
                    name = output_name(f"{stem}-{st.id[-6:]}", kind)
                self._owners[(dest.name, name)] = (st.id, st.session)
            target = dest / name
            if not target.exists():
                copy_output(kind, src, target)
            out[kind] = target
        with self._lock:
            self._done[key] = dict(out)
            self._shown[st.id] = time.monotonic()
        return out

    def trim(self, live: set[str], age_s: float = 86400.0, now: Optional[float] = None) -> int:
        """Remove published copies that are no longer needed; the number of files removed.

        A copy goes when its job's own files are gone (``live``: the jobs that still have
        theirs; the disk budget removed the others, and their copies would go on taking the
        budget's room), or when it is older than ``age_s`` (as Gradio's own clean-up ages
        what it serves, which does not see files a page only links to, such as the
        history's downloads). Never one a page was given in the last ``age_s``
        (``shown_within``): a page may be showing it. Copies are made again when a page asks
        for them (``publish``). Run by the supervisor's housekeeper after each pass."""
        if not self.root.is_dir():
            return 0
        now = time.time() if now is None else now
        shown = self.shown_within(age_s)
        with self._lock:
            owners = dict(self._owners)
        removed = 0
        for folder in list(self.root.iterdir()):
            if not folder.is_dir():
                continue
            for f in list(folder.iterdir()):
                job = owners.get((folder.name, f.name), ("", ""))[0]
                try:
                    old = f.stat().st_mtime < now - age_s
                except OSError:
                    continue
                if job in shown or not (old or (job and job not in live)):
                    continue
                try:
                    f.unlink()
                    removed += 1
                except OSError:
                    continue
                with self._lock:
                    self._owners.pop((folder.name, f.name), None)
            try:
                folder.rmdir()   # only when empty
            except OSError:
                pass
        with self._lock:   # what was published from removed files is published again on demand
            for key in [k for k, v in self._done.items() if not all(p.exists() for p in v.values())]:
                del self._done[key]
        return removed

    def shown_within(self, seconds: float) -> set[str]:
        """Jobs whose outputs a page was given in the last ``seconds``: results a page may be
        showing now (the disk budgets keep them). Older marks are dropped here, so the
        record stays as small as the recent past."""
        cutoff = time.monotonic() - seconds
        with self._lock:
            for job_id in [j for j, t in self._shown.items() if t < cutoff]:
                del self._shown[job_id]
            return set(self._shown)

    def owner(self, path: str) -> Optional[str]:
        """The session whose job a published file (a served path ending
        ``<folder>/<name>.glb|ply|stl|zip``) came from; None for any file this server did not
        publish, e.g. one from before a restart or a copy elsewhere."""
        p = Path(str(path))
        if RESULT_NAME_RE.fullmatch(p.name) is None:
            return None
        with self._lock:
            hit = self._owners.get((p.parent.name, p.name))
        return hit[1] if hit else None
