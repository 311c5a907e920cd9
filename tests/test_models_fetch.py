"""``kiln models list|fetch`` against a loopback HTTP server (the real hosts are not reachable
here; their URLs are data). The server serves a generated 2 MB file, honours Range (or,
when told, ignores it), and can drop the connection mid-file or serve wrong bytes.
The catalogue is swapped for entries pointing at it (``kiln.models.CATALOGUE``)."""

from __future__ import annotations

import hashlib
import random
import re
import socket
import threading
from collections import namedtuple
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from app.cli.cli import main
from kiln import models
from kiln.fetch import Progress

DATA = random.Random(23).randbytes(2_000_003)
SHA = hashlib.sha256(DATA).hexdigest()


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.mode = "normal"     # normal | ignore_range | drop | wrong
        self.drop_after = 700_000
        self.requests: list[tuple[str, str]] = []   # (path, Range header or "")


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        srv: Server = self.server   # type: ignore[assignment]
        rng = self.headers.get("Range", "")
        srv.requests.append((self.path, rng))
        if self.path.endswith("/missing.pt"):
            self.send_error(404, "Not Found")
            return
        body = DATA if srv.mode != "wrong" else DATA[:1000] + bytes([DATA[1000] ^ 0xFF]) + DATA[1001:]
        m = re.fullmatch(r"bytes=(\d+)-", rng)
        start = int(m.group(1)) if m and srv.mode != "ignore_range" else 0
        if start >= len(body):
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{len(body)}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(206 if start else 200)
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        self.send_header("Content-Length", str(len(body) - start))
        self.end_headers()
        if srv.mode == "drop":
            self.wfile.write(body[start:start + srv.drop_after])
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        self.wfile.write(body[start:])


@pytest.fixture
def server():
    srv = Server()
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


Env = namedtuple("Env", "server dest pinned unpinned")


@pytest.fixture
def env(server, tmp_path, monkeypatch):
    """A catalogue of two loopback files: one pinned (size + sha256), one unpinned."""
    base = f"http://127.0.0.1:{server.server_address[1]}"
    pinned = models.ModelFile("pinned.pt", f"{base}/pinned.pt", len(DATA), SHA, "sam2")
    unpinned = models.ModelFile("unpinned.pt", f"{base}/unpinned.pt", None, None, "sam2",
                                note=models.UNVERIFIED_NOTE)
    gated = models.ModelFile("sam-3d-objects", f"{base}/gated", None, None, "sam3d", gated=True)
    monkeypatch.setattr(models, "CATALOGUE", (pinned, unpinned, gated))
    monkeypatch.delenv(models.MODELS_DIR_ENV, raising=False)
    return Env(server, tmp_path / "models", pinned, unpinned)


def fetch(env, *names, dest=True):
    return main(["models", "fetch", *names] + (["--dest", str(env.dest)] if dest else []))


def test_full_fetch_is_verified_and_renamed(env, capsys, monkeypatch):
    import kiln.fetch

    monkeypatch.setattr(kiln.fetch, "CHUNK", 32 << 10)   # many chunks per tenth
    assert fetch(env, "pinned") == 0
    out = capsys.readouterr()
    final = env.dest / "pinned.pt"
    assert final.read_bytes() == DATA
    assert not (env.dest / "pinned.pt.part").exists()
    assert "verified" in out.out and SHA in out.out
    assert env.server.requests == [("/pinned.pt", "")]
    # not a terminal: one progress line per 10 %, not one per chunk
    tenths = [int(m.group(1)) // 10 for m in re.finditer(r"(\d+)% ", out.err)]
    assert tenths == list(range(1, 11))


def test_resume_after_connection_drop(env, capsys):
    env.server.mode = "drop"
    assert fetch(env, "pinned.pt") == 1
    err = capsys.readouterr().err
    assert "run the same command again to resume" in err
    part = env.dest / "pinned.pt.part"
    kept = part.stat().st_size
    assert 0 < kept < len(DATA) and not (env.dest / "pinned.pt").exists()

    env.server.mode = "normal"
    assert fetch(env, "pinned.pt") == 0
    assert env.server.requests[-1] == ("/pinned.pt", f"bytes={kept}-")
    assert (env.dest / "pinned.pt").read_bytes() == DATA
    assert not part.exists()


def test_server_ignoring_range_restarts_from_zero(env, capsys):
    env.dest.mkdir()
    (env.dest / "pinned.pt.part").write_bytes(DATA[:500_000])
    env.server.mode = "ignore_range"
    assert fetch(env, "pinned") == 0
    assert env.server.requests == [("/pinned.pt", "bytes=500000-")]
    assert "starting again from 0" in capsys.readouterr().err
    assert (env.dest / "pinned.pt").read_bytes() == DATA


def test_complete_part_is_finished_without_a_body(env):
    """A part that already holds every byte (killed before the rename): the server answers 416."""
    env.dest.mkdir()
    (env.dest / "unpinned.pt.part").write_bytes(DATA)
    assert fetch(env, "unpinned") == 0
    assert env.server.requests == [("/unpinned.pt", f"bytes={len(DATA)}-")]
    assert (env.dest / "unpinned.pt").read_bytes() == DATA


def test_wrong_bytes_are_deleted_with_download_again(env, capsys):
    env.server.mode = "wrong"
    assert fetch(env, "pinned") == 1
    err = capsys.readouterr().err
    assert "corrupt" in err and "download again" in err and SHA in err
    assert not (env.dest / "pinned.pt").exists()
    assert not (env.dest / "pinned.pt.part").exists()


def test_present_and_verified_is_skipped_without_a_request(env, capsys):
    env.dest.mkdir()
    (env.dest / "pinned.pt").write_bytes(DATA)
    assert fetch(env, "pinned") == 0
    assert "skipped" in capsys.readouterr().out
    assert env.server.requests == []


def test_corrupt_present_file_is_fetched_again(env, capsys):
    env.dest.mkdir()
    (env.dest / "pinned.pt").write_bytes(DATA[:-1] + b"x")
    assert fetch(env, "pinned") == 0
    assert "fetching it again" in capsys.readouterr().err
    assert (env.dest / "pinned.pt").read_bytes() == DATA


def test_not_enough_disk_is_refused_before_downloading(env, capsys, monkeypatch):
    import shutil

    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(10 << 30, 10 << 30, 1 << 20))
    assert fetch(env, "pinned") == 1
    assert "not enough free space" in capsys.readouterr().err
    assert env.server.requests == []
    assert not (env.dest / "pinned.pt.part").exists()


def test_kiln_models_dir_is_honoured(env, monkeypatch, tmp_path):
    target = tmp_path / "elsewhere"
    monkeypatch.setenv(models.MODELS_DIR_ENV, str(target))
    assert fetch(env, "pinned", dest=False) == 0
    assert (target / "pinned.pt").read_bytes() == DATA


def test_unpinned_file_is_recorded_then_checked(env, capsys):
    assert fetch(env, "unpinned") == 0
    out = capsys.readouterr().out
    assert "unverified" in out and SHA in out and f"{len(DATA):,}" in out
    assert models.read_record(env.dest / "unpinned.pt") == (SHA, len(DATA))
    assert fetch(env, "unpinned") == 0
    assert "skipped" in capsys.readouterr().out
    assert len(env.server.requests) == 1


def test_all_fetches_every_ungated_file_and_prints_gated_commands(env, capsys):
    assert fetch(env, "all") == 0
    err = capsys.readouterr().err
    assert sorted(p for p, _ in env.server.requests) == ["/pinned.pt", "/unpinned.pt"]
    assert "hf download" in err and "facebook/sam-3d-objects" in err


def test_gated_and_unknown_names_are_usage_errors(env, capsys):
    assert fetch(env, "sam3d") == 2
    err = capsys.readouterr().err
    assert "gated" in err and "hf auth login" in err
    assert fetch(env, "nonesuch") == 2
    assert "unknown model 'nonesuch'" in capsys.readouterr().err
    assert env.server.requests == []


def test_http_error_is_clear(env, capsys, monkeypatch):
    missing = models.ModelFile("missing.pt", env.pinned.url.replace("pinned", "missing"), None, None, "sam2")
    monkeypatch.setattr(models, "CATALOGUE", (missing,))
    assert fetch(env, "missing") == 1
    assert "answered 404" in capsys.readouterr().err


def test_list_shows_each_state(env, capsys):
    env.dest.mkdir()
    (env.dest / "pinned.pt").write_bytes(DATA)
    assert main(["models", "list", "--dest", str(env.dest)]) == 0
    out = capsys.readouterr().out
    rows = {ln.split()[0]: ln for ln in out.splitlines() if ln.strip()}
    assert rows["pinned.pt"].endswith("verified") and "2.0 MB" in rows["pinned.pt"]
    assert rows["unpinned.pt"].endswith("absent")
    assert "gated" in rows["sam-3d-objects"] and "hf download" in out
    assert "no published checksum" in out

    (env.dest / "unpinned.pt").write_bytes(b"abc")
    (env.dest / "pinned.pt").write_bytes(b"short")
    main(["models", "list", "--dest", str(env.dest)])
    out = capsys.readouterr().out
    rows = {ln.split()[0]: ln for ln in out.splitlines() if ln.strip()}
    assert rows["pinned.pt"].endswith("CORRUPT") and rows["unpinned.pt"].endswith("present, unverified")

    (env.dest / "pinned.pt").unlink()
    (env.dest / "pinned.pt.part").write_bytes(b"12")
    main(["models", "list", "--dest", str(env.dest)])
    assert "partial" in {ln.split()[0]: ln for ln in capsys.readouterr().out.splitlines() if ln.strip()}["pinned.pt"]


def test_real_catalogue_pins_only_what_is_known():
    tiny = models.lookup("tiny")
    assert tiny is not None and tiny.size == 156_008_466
    assert tiny.sha256 == "7402e0d864fa82708a20fbd15bc84245c2f26dff0eb43a4b5b93452deb34be69"
    assert tiny.url == "https://dl.fbaipublicfiles.com/segment_anything_2/092824/sam2.1_hiera_tiny.pt"
    for size in ("small", "base_plus", "large"):
        m = models.lookup(size)
        assert m is not None and m.size is None and m.sha256 is None and "unverified" in m.note
    assert models.lookup("sam3d").gated


def test_models_dir_default_is_the_app_checkpoint_folder():
    from kiln.checkpoints import DEFAULT_FOLDER

    assert models.models_dir({}) == Path(DEFAULT_FOLDER)
    assert models.models_dir({models.MODELS_DIR_ENV: "/x/y"}) == Path("/x/y")


class _Tty:
    def __init__(self):
        self.text = ""

    def isatty(self):
        return True

    def write(self, s):
        self.text += s

    def flush(self):
        pass


def test_progress_on_a_terminal_redraws_one_line():
    tty = _Tty()
    p = Progress("f.pt", 100, tty)
    for done in range(0, 101, 10):
        p.update(done)
    p.close()
    assert tty.text.count("\n") == 1 and "\r" in tty.text and "100%" in tty.text
