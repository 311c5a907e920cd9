"""Publishing finished outputs where the browser downloads them, owned by the session that
made them."""

from __future__ import annotations

import re
import secrets
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Optional

from .messages import UIError

# how a published result is named, wherever Gradio copies it (the server's file guard matches it)
RESULT_NAME_RE = re.compile(r"kiln-([A-Za-z0-9_-]+)\.(glb|ply)")


class ResultPublisher:
    """Copies a session's finished outputs into Gradio's own file folder under an
    unguessable name, so the browser downloads them from there and the job store
    itself is never served. Copies are made once per (session, job)."""

    def __init__(self, root: Path, prune_age_s: float = 86400.0):
        self.root = Path(root)
        self._prune(prune_age_s)
        self._lock = threading.Lock()
        self._tokens: dict[str, str] = {}
        self._done: dict[tuple[str, str], dict[str, Path]] = {}
        self._owners: dict[str, str] = {}

    def _prune(self, age_s: float) -> None:
        """Drop session folders older than ``age_s``: sessions do not outlive a server, and
        every published file is only a copy of a job output."""
        if not self.root.is_dir():
            return
        cutoff = time.time() - age_s
        for d in self.root.iterdir():
            try:
                if d.is_dir() and d.stat().st_mtime < cutoff:
                    shutil.rmtree(d, ignore_errors=True)
            except OSError:
                continue

    def _session_dir(self, session: str) -> Path:
        with self._lock:
            tok = self._tokens.setdefault(session, secrets.token_hex(16))
        return self.root / tok

    def publish(self, session: str, st: Any) -> dict[str, Path]:
        """{'glb': path, 'ply': path} copies of a done job's outputs; {} otherwise.

        Refuses jobs of other sessions: a session only ever gets its own files.
        """
        if st is None or st.state != "done" or not st.outputs:
            return {}
        if st.session != session:
            raise UIError("that result belongs to another session")
        key = (session, st.id)
        with self._lock:
            if key in self._done and all(p.exists() for p in self._done[key].values()):
                return dict(self._done[key])
        dest = self._session_dir(session) / st.id
        dest.mkdir(parents=True, exist_ok=True)
        out = {}
        for kind, src in sorted(st.outputs.items()):
            src = Path(src)
            if kind not in ("glb", "ply") or not src.is_file():
                continue
            target = dest / f"kiln-{st.id}.{kind}"
            if not target.exists():
                tmp = target.with_name(target.name + ".tmp")
                shutil.copyfile(src, tmp)
                tmp.replace(target)
            out[kind] = target
        with self._lock:
            self._done[key] = dict(out)
            self._owners[st.id] = session
        return out

    def owner(self, file_name: str) -> Optional[str]:
        """The session a published file (``kiln-<job>.<ext>``, wherever Gradio copied it)
        belongs to; None for a name that is no published result of this server."""
        m = RESULT_NAME_RE.fullmatch(file_name)
        if m is None:
            return None
        with self._lock:
            return self._owners.get(m.group(1))

