"""Per-tab session state on disk, keyed by the session name the server derives from the
browser cookie and the tab (``browser.session_name``), with limits per client and in total.

Why not Gradio's ``gr.State``: Gradio keys it by the tab's ``session_hash``, a value the
client chooses, so anyone who learns a tab's hash reads and changes its state. And it
holds what it is given in memory for hours: a 154 KB PNG that decodes to 40 MP pinned
~150 MB per tab. Here a tab's image lives in a folder of its own (the uploaded file, the
<= 1024 px working copy, the mask) and memory holds a small record; the full-size pixels
are decoded again only when a job is submitted (``WorkImage.full``).

A reload is a new tab to Gradio. So that it does not lose the person's image and clicks,
a closed tab's state is parked under its browser (``park``; one per browser) and the
browser's next page takes over its newest state, parked or in another open tab
(``adopt``). Parked states count towards the byte limits but give way (oldest first) to
any upload that would otherwise be refused.

A client is a network address (``requestinfo.client_of``): cookies cost nothing to mint,
addresses do. Behind a reverse proxy listed in ``app.trusted_proxies`` it is the address
the proxy forwards (``app.web.server.proxies``); behind any other, everyone shares the proxy's.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterator, Optional

import numpy as np

from app.web.server.browser import browser_of
from app.web.server.usertext import UIError
from app.web.state.uploads import STATE_EXTRA_FIELDS, SessionState, WorkImage

log = logging.getLogger(__name__)

# What the working copy, its alpha and the mask can take on disk, beyond the upload itself
# (segment.SEG_MAX_SIDE = 1024: 3 MB RGB + 1 MB alpha + 1 MB mask, plus .npy headers).
WORK_BYTES_MAX = 5 * 1024 * 1024 + 4096
MiB = 1024 * 1024


@dataclass(frozen=True)
class SessionLimits:
    max_sessions: int = 200
    max_sessions_per_client: int = 8
    max_bytes: int = 2048 * MiB
    max_bytes_per_client: int = 256 * MiB
    ttl_s: float = 6 * 3600.0

    @classmethod
    def from_settings(cls, app) -> "SessionLimits":
        """From ``kiln.settings.AppSettings``."""
        return cls(max_sessions=app.max_sessions, max_sessions_per_client=app.max_sessions_per_client,
                   max_bytes=int(app.max_session_mb * MiB),
                   max_bytes_per_client=int(app.max_session_mb_per_client * MiB),
                   ttl_s=app.session_ttl_h * 3600.0)


@dataclass
class _Record:
    dir: Path
    client: str
    image: WorkImage          # its arrays are not kept: see _light
    clicks: tuple
    use_alpha: bool
    has_mask: bool
    bytes: int
    touched: float
    extra: Optional[dict] = None   # SessionState's small fields (uploads.STATE_EXTRA_FIELDS)


def _extra(state: SessionState) -> dict:
    return {k: getattr(state, k) for k in STATE_EXTRA_FIELDS}


def _light(img: WorkImage) -> WorkImage:
    """The record's copy of an image: metadata only, the arrays are on disk."""
    empty = np.zeros((0, 0, 3), np.uint8)
    return replace(img, work=empty, work_alpha=None)


def _mb(n: int) -> str:
    return f"{n / MiB:.0f} MB"


class SessionStore:
    """``get(session)`` -> SessionState; ``edit(session, client)`` a context manager that
    yields the state and a setter, serialised per session; ``admit`` checks the limits
    before an upload is decoded; ``drop`` forgets a tab; ``park`` keeps a closed tab's
    state for its browser's next page, which ``adopt`` hands it to. Thread-safe."""

    def __init__(self, root: Path, limits: SessionLimits, clock: Callable[[], float] = time.monotonic):
        self.root = Path(root)
        self.limits = limits
        self._clock = clock
        # sessions do not outlive the server process: what an earlier one left is garbage
        shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._records: dict[str, _Record] = {}
        self._parked: dict[str, _Record] = {}     # browser id -> its last closed tab's state
        self._session_locks: dict[str, threading.Lock] = {}

    # -- limits ------------------------------------------------------------------
    def _expire(self, now: float) -> None:
        for name in [n for n, r in self._records.items() if now - r.touched > self.limits.ttl_s]:
            self._remove(name)
        for b in [b for b, r in self._parked.items() if now - r.touched > self.limits.ttl_s]:
            shutil.rmtree(self._parked.pop(b).dir, ignore_errors=True)

    def _make_room(self, client: str, nbytes: int, others: list) -> None:
        """Let parked states go, oldest first (this client's before anyone's), until
        ``nbytes`` more fits the byte limits. Under the lock."""
        L = self.limits
        def fits() -> bool:
            parked = list(self._parked.values())
            mine = [r for r in others + parked if r.client == client]
            return (sum(r.bytes for r in mine) + nbytes <= L.max_bytes_per_client
                    and sum(r.bytes for r in others + parked) + nbytes <= L.max_bytes)
        for b, _ in sorted(self._parked.items(), key=lambda kv: (kv[1].client != client, kv[1].touched)):
            if fits():
                return
            shutil.rmtree(self._parked.pop(b).dir, ignore_errors=True)

    def _remove(self, session: str) -> None:
        rec = self._records.pop(session, None)
        if rec is not None:
            shutil.rmtree(rec.dir, ignore_errors=True)

    def _check(self, session: str, client: str, nbytes: int) -> None:
        """UIError when a new image of ``nbytes`` for ``session`` would break a limit.
        The session's own image does not count: it is being replaced. Under the lock."""
        L = self.limits
        others = [r for n, r in self._records.items() if n != session]
        self._make_room(client, nbytes, others)
        others += list(self._parked.values())   # what is left of them still takes room
        mine = [r for r in others if r.client == client]
        tabs = sum(1 for n, r in self._records.items() if n != session and r.client == client)
        if tabs >= L.max_sessions_per_client:
            raise UIError(f"this computer already has {tabs} tabs with an image open here "
                          f"(the limit is {L.max_sessions_per_client}); close one, or wait until "
                          "unused tabs expire, then upload again")
        open_tabs = len(self._records) - (session in self._records)
        if open_tabs >= L.max_sessions:
            raise UIError(f"the server is holding images for {open_tabs} tabs, its limit; "
                          "try again in a while")
        if sum(r.bytes for r in mine) + nbytes > L.max_bytes_per_client:
            raise UIError(f"the images open in this computer's tabs take "
                          f"{_mb(sum(r.bytes for r in mine))}; with this one it would be more "
                          f"than the {_mb(L.max_bytes_per_client)} allowed; close a tab first")
        if sum(r.bytes for r in others) + nbytes > L.max_bytes:
            raise UIError("the server's room for uploaded images is full; try again in a while")

    def admit(self, session: str, client: str, upload_bytes: int) -> None:
        """Before an upload of ``upload_bytes`` is decoded: UIError past the limits."""
        with self._lock:
            self._expire(self._clock())
            self._check(session, client, upload_bytes + WORK_BYTES_MAX)

    # -- state -------------------------------------------------------------------
    def get(self, session: str) -> SessionState:
        with self._lock:
            rec = self._records.get(session)
            if rec is None:
                return SessionState()
            rec.touched = self._clock()
        return self._load(rec)

    def _load(self, rec: _Record) -> SessionState:
        try:
            work = np.load(rec.dir / "work.npy")
            work_alpha = np.load(rec.dir / "work_alpha.npy") if rec.image.has_alpha else None
            mask = np.load(rec.dir / "mask.npy") if rec.has_mask else None
        except (OSError, ValueError):
            log.exception("session files in %s unreadable", rec.dir)
            return SessionState()
        img = replace(rec.image, work=work, work_alpha=work_alpha)
        return SessionState(image=img, clicks=rec.clicks, mask=mask, use_alpha=rec.use_alpha,
                            **(rec.extra or {}))

    def put(self, session: str, client: str, state: SessionState) -> None:
        """Keep ``state`` for ``session``. A new image is checked against the limits
        (UIError past them) and written to the session's own folder."""
        img = state.image
        with self._lock:
            now = self._clock()
            self._expire(now)
            rec = self._records.get(session)
            if img is None:
                self._remove(session)
                return
            same = rec is not None and rec.image.key == img.key and rec.image.size == img.size
        if not same:
            self._new_image(session, client, state, now)
            return
        assert rec is not None   # same image as the record's
        if state.mask is not None:
            _save(rec.dir / "mask.npy", np.asarray(state.mask, bool))
        with self._lock:
            rec.clicks, rec.use_alpha, rec.has_mask = state.clicks, state.use_alpha, state.mask is not None
            rec.extra = _extra(state)
            rec.touched = now

    def _new_image(self, session: str, client: str, state: SessionState, now: float) -> None:
        img = state.image
        assert img is not None   # a state without an image removes the session instead
        d = self.root / secrets.token_hex(16)
        d.mkdir()
        try:
            src = d / "upload"
            if isinstance(img.source, (bytes, bytearray)):
                src.write_bytes(img.source)
            else:
                shutil.copyfile(img.source, src)
            _save(d / "work.npy", img.work)
            if img.work_alpha is not None:
                _save(d / "work_alpha.npy", img.work_alpha)
            if state.mask is not None:
                _save(d / "mask.npy", np.asarray(state.mask, bool))
            size = sum(p.stat().st_size for p in d.iterdir())
        except OSError:
            shutil.rmtree(d, ignore_errors=True)
            raise
        rec = _Record(dir=d, client=client, image=_light(replace(img, source=src)), clicks=state.clicks,
                      use_alpha=state.use_alpha, has_mask=state.mask is not None,
                      bytes=size + WORK_BYTES_MAX // 5, touched=now, extra=_extra(state))   # room for a mask written later
        with self._lock:
            try:
                self._check(session, client, rec.bytes)   # again: others may have come meanwhile
            except UIError:
                shutil.rmtree(d, ignore_errors=True)
                raise
            self._remove(session)
            self._records[session] = rec

    @contextmanager
    def edit(self, session: str, client: str) -> Iterator[tuple[SessionState, Callable[[SessionState], None]]]:
        """``with store.edit(session, client) as (state, save): ... save(new_state)``; edits
        of one session run one at a time (two quick clicks must not lose one)."""
        with self._lock:
            if len(self._session_locks) > 4 * self.limits.max_sessions:
                # tabs that clicked without an image leave a lock behind: forget the idle ones
                for name in [n for n, lk in self._session_locks.items()
                             if n not in self._records and not lk.locked()]:
                    del self._session_locks[name]
            lock = self._session_locks.setdefault(session, threading.Lock())
        with lock:
            yield self.get(session), lambda st: self.put(session, client, st)

    def drop(self, session: str) -> None:
        """The person removed the image: free it now, and what the browser had parked
        (a reload must not bring back an image the person took away)."""
        with self._lock:
            self._remove(session)
            self._session_locks.pop(session, None)
            parked = self._parked.pop(browser_of(session) or "", None)
            if parked is not None:
                shutil.rmtree(parked.dir, ignore_errors=True)

    def park(self, session: str) -> None:
        """The tab closed (or is being reloaded): keep its state for the browser's next
        page (replacing what the browser had parked), or free it when the tab has no
        browser cookie."""
        with self._lock:
            rec = self._records.pop(session, None)
            self._session_locks.pop(session, None)
            bid = browser_of(session)
            if rec is None:
                return
            if bid is None:
                shutil.rmtree(rec.dir, ignore_errors=True)
                return
            old = self._parked.pop(bid, None)
            if old is not None:
                shutil.rmtree(old.dir, ignore_errors=True)
            rec.touched = self._clock()
            self._parked[bid] = rec

    def adopt(self, session: str, client: str) -> SessionState:
        """A page just loaded as ``session``: when it has no state yet, give it its
        browser's newest one: the parked state of a closed tab (moved), or that of a tab
        still open (copied; on a reload the old tab's close may arrive after the new
        page's load). Returns the session's state; empty when there was nothing to take
        or the limits refuse the copy."""
        bid = browser_of(session)
        with self._lock:
            if bid is None or session in self._records:
                rec = None
            else:
                live = [r for n, r in self._records.items() if browser_of(n) == bid]
                newest = max(live, key=lambda r: r.touched, default=None)
                parked = self._parked.get(bid)
                if parked is not None and (newest is None or parked.touched >= newest.touched):
                    del self._parked[bid]
                    parked.client, parked.touched = client, self._clock()
                    self._records[session] = parked
                    rec = None
                else:   # a snapshot to copy outside the lock
                    rec = replace(newest) if newest is not None else None
        if rec is not None:
            self._copy_in(session, client, rec)
        return self.get(session)

    def _copy_in(self, session: str, client: str, rec: _Record) -> None:
        d = self.root / secrets.token_hex(16)
        d.mkdir()
        try:
            for f in rec.dir.iterdir():
                if f.name.endswith(".tmp.npy"):
                    continue
                try:
                    os.link(f, d / f.name)   # files are replaced, never written in place
                except OSError:
                    shutil.copyfile(f, d / f.name)
            new = replace(rec, dir=d, client=client, touched=self._clock(),
                          image=replace(rec.image, source=d / "upload"))
            with self._lock:
                if session in self._records:
                    raise UIError("taken meanwhile")
                self._check(session, client, new.bytes)
                self._records[session] = new
        except (OSError, UIError) as e:
            log.info("not restoring %s into a new page: %s", rec.dir.name, e)
            shutil.rmtree(d, ignore_errors=True)

    def usage(self) -> dict:
        """{'sessions': n, 'parked': n, 'bytes': n, 'clients': {address: sessions}}; bytes
        include the parked states."""
        with self._lock:
            self._expire(self._clock())
            clients: dict[str, int] = {}
            for r in self._records.values():
                clients[r.client] = clients.get(r.client, 0) + 1
            kept = list(self._records.values()) + list(self._parked.values())
            return {"sessions": len(self._records), "parked": len(self._parked),
                    "bytes": sum(r.bytes for r in kept), "clients": clients}


def _save(path: Path, arr: np.ndarray) -> None:
    tmp = path.with_name(path.name + ".tmp.npy")
    np.save(tmp, np.ascontiguousarray(arr))
    tmp.replace(path)
