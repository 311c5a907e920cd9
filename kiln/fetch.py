"""Download one model file: resumable, checked, and never a torn file under the real name.

Standard library only (``urllib.request``) so fetching adds no dependency. The bytes
go to ``NAME.part``; an interrupted download keeps it and the next run asks the
server for the rest with a ``Range`` header (a server answering 200 instead of 206
sends the whole file, so the part is restarted). Size and sha256 are checked on
the complete part before ``os.replace`` gives it its real name; a mismatch deletes
the part, because resuming a corrupt prefix would only reproduce the corruption.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import re
import shutil
import socket
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, TextIO

from kiln.models import ModelFile, write_record

CHUNK = 256 << 10
TIMEOUT_S = 30.0
# room left over for the file system and whatever else writes there meanwhile
FREE_MARGIN = 64 << 20
RESUME_HINT = "the partial file is kept: run the same command again to resume"


class FetchError(Exception):
    """A download failed; the message says what happened and what to do next."""


@dataclass(frozen=True)
class Fetched:
    path: Path
    size: int
    sha256: str
    verified: bool    # against a pinned sha256 (False: recorded only)


def part_path(path: Path) -> Path:
    return path.with_name(path.name + ".part")


class Progress:
    """A live line on a terminal; elsewhere (logs, CI) one line per 10 %, so a log
    shows that a long download moves without thousands of lines."""

    def __init__(self, name: str, total: Optional[int], stream: Optional[TextIO] = None, start: int = 0):
        self.name, self.total = name, total
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.t0 = time.monotonic()
        self.start_bytes = start   # a resumed download's rate counts this run's bytes only
        self.next_tenth = start * 10 // total + 1 if total else 1
        self.last_draw = 0.0

    def update(self, done: int) -> None:
        if self.tty:
            now = time.monotonic()
            if now - self.last_draw >= 0.2 or done == self.total:
                self.last_draw = now
                self.stream.write(f"\r{self._text(done)}\x1b[K")
                self.stream.flush()
        elif self.total:
            if done * 10 >= self.next_tenth * self.total:   # one line even when a chunk spans two tenths
                self.stream.write(f"{self._text(done)}\n")
                self.stream.flush()
                self.next_tenth = done * 10 // self.total + 1

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()

    def _text(self, done: int) -> str:
        secs = max(time.monotonic() - self.t0, 1e-6)
        rate = (done - self.start_bytes) / secs / 1e6
        if self.total:
            return (f"{self.name}: {100 * done // self.total:3d}% {done / 1e6:,.1f} / "
                    f"{self.total / 1e6:,.1f} MB  {rate:.1f} MB/s")
        return f"{self.name}: {done / 1e6:,.1f} MB  {rate:.1f} MB/s"


def check_free(folder: Path, needed: int, disk_usage: Optional[Callable] = None) -> None:
    """Refuse before downloading when ``folder``'s file system cannot hold ``needed`` more bytes."""
    free = (disk_usage or shutil.disk_usage)(folder).free
    if free < needed + FREE_MARGIN:
        raise FetchError(f"not enough free space in {folder}: {needed / 1e6:,.1f} MB to download "
                         f"(+{FREE_MARGIN >> 20} MiB margin), {free / 1e6:,.1f} MB free; free some space "
                         "or choose another folder with --dest or KILN_MODELS_DIR")


def _open(url: str, offset: int, timeout: float) -> http.client.HTTPResponse:
    req = urllib.request.Request(url, headers={"User-Agent": "kiln-models-fetch"})
    if offset:
        req.add_header("Range", f"bytes={offset}-")
    try:
        return urllib.request.urlopen(req, timeout=timeout)
    except urllib.error.HTTPError as e:
        if e.code == 416:    # Range past the end: the part is already whole (or too long)
            return e         # type: ignore[return-value]
        raise FetchError(f"{url}: the server answered {e.code} {e.reason}") from None
    except urllib.error.URLError as e:
        raise FetchError(f"cannot reach {url}: {e.reason}") from None
    except (socket.timeout, TimeoutError):
        raise FetchError(f"{url}: no answer within {timeout:g} s; try again later") from None


def _content_start(resp, offset: int) -> int:
    """Where the body starts in the file: ``offset`` for a 206 whose Content-Range says so,
    0 for a 200 (the server ignored Range)."""
    if resp.status != 206:
        return 0
    m = re.match(r"bytes (\d+)-", resp.headers.get("Content-Range", ""))
    if not m or int(m.group(1)) != offset:
        raise FetchError(f"the server answered a resume request at byte {offset} with "
                         f"Content-Range {resp.headers.get('Content-Range')!r}; delete the .part file and "
                         "run the same command again")
    return offset


def _expected_total(model: ModelFile, resp, start: int) -> Optional[int]:
    length = resp.headers.get("Content-Length")
    from_server = start + int(length) if length and length.isdigit() else None
    if model.size is not None and from_server is not None and from_server != model.size:
        raise FetchError(f"{model.url}: the server offers {from_server:,} bytes, {model.name} has "
                         f"{model.size:,}; it is not the expected file (nothing was downloaded)")
    return model.size if model.size is not None else from_server


def _hash_prefix(part: Path, upto: int) -> "hashlib._Hash":
    h = hashlib.sha256()
    with open(part, "rb") as f:
        left = upto
        while left and (block := f.read(min(CHUNK, left))):
            h.update(block)
            left -= len(block)
    return h


def _stream(resp, part: Path, start: int, total: Optional[int], progress: Progress) -> tuple[int, str]:
    """Append the body to ``part`` from byte ``start``; (bytes in part, sha256 of them).
    A dropped connection or a short body keeps the part and raises with the resume hint."""
    h = _hash_prefix(part, start) if start else hashlib.sha256()
    done = start
    with open(part, "r+b" if start else "wb") as f:
        f.seek(start)
        f.truncate()
        try:
            while block := resp.read(CHUNK):
                f.write(block)
                h.update(block)
                done += len(block)
                progress.update(done)
        except (http.client.IncompleteRead, ConnectionError, socket.timeout, TimeoutError) as e:
            f.flush()
            raise FetchError(f"the connection dropped after {done:,} bytes"
                             f"{f' of {total:,}' if total else ''} ({type(e).__name__}); {RESUME_HINT}") from None
        f.flush()
        os.fsync(f.fileno())
    if total is not None and done < total:
        raise FetchError(f"the server stopped after {done:,} of {total:,} bytes; {RESUME_HINT}")
    return done, h.hexdigest()


def _verify(model: ModelFile, part: Path, size: int, sha: str) -> None:
    """Delete the part on a size or sha256 mismatch: resuming it would keep the bad bytes."""
    problem = None
    if model.size is not None and size != model.size:
        problem = f"it has {size:,} bytes, expected {model.size:,}"
    elif model.sha256 is not None and sha != model.sha256:
        problem = f"its sha256 is {sha}, expected {model.sha256}"
    if problem:
        part.unlink(missing_ok=True)
        raise FetchError(f"{model.name} is corrupt: {problem}. The partial file was deleted; "
                         "download again (run the same command)")


def fetch(model: ModelFile, folder: Path, *, timeout: float = TIMEOUT_S, stream: Optional[TextIO] = None,
          disk_usage: Optional[Callable] = None) -> Fetched:
    """Download ``model`` into ``folder`` (resuming ``NAME.part``), verify it, and rename it
    into place. The caller decides whether a present file should be fetched at all."""
    if model.gated:
        raise FetchError(f"{model.name} is gated; Kiln does not download it")
    folder.mkdir(parents=True, exist_ok=True)
    final, part = folder / model.name, part_path(folder / model.name)
    have = part.stat().st_size if part.is_file() else 0
    if model.size is not None and have > model.size:
        part.unlink()   # longer than the file can be: not a prefix of it
        have = 0
    if model.size is not None:
        check_free(folder, model.size - have, disk_usage)
    resp = _open(model.url, have, timeout)
    try:
        if resp.status == 416:
            size, sha = have, _hash_prefix(part, have).hexdigest()
        else:
            start = _content_start(resp, have)
            if have and start == 0:
                print(f"{model.name}: the server does not resume downloads; starting again from 0",
                      file=stream or sys.stderr)
            total = _expected_total(model, resp, start)
            if model.size is None and total is not None:
                check_free(folder, total - start, disk_usage)
            progress = Progress(model.name, total, stream, start)
            try:
                size, sha = _stream(resp, part, start, total, progress)
            finally:
                progress.close()
    finally:
        resp.close()
    _verify(model, part, size, sha)
    os.chmod(part, 0o644)
    os.replace(part, final)
    if not model.pinned:
        write_record(final, sha, size)
    return Fetched(final, size, sha, verified=model.pinned)
