"""Fuzz every reader of untrusted bytes for a bounded time and print what it found.

    .venv/bin/python bench/fuzz.py [--seconds 20] [--readers image,mesh,...] [--crashes var/fuzz-crashes]
                                   [--engine auto|atheris|mutate]

The readers, their seeds and the property they must keep are ``tests/fuzz_targets.py``'s (the
hypothesis tests use the same): a valid result or the documented error with a clear message,
within 10 s and 512 MiB. Each reader is fuzzed in its own subprocess, so a native crash of one
(SIGSEGV in a decoder) is reported as such and the others still run.

Engines: ``atheris`` (coverage-guided libFuzzer over Kiln's readers and the libraries they call:
trimesh, PIL's Python plugins, plyfile, PyYAML), ``mutate`` (random byte flips, truncations,
splices and interesting numbers over the seeds; used when atheris is not installed).
The first byte of an input picks the seed file it stands for (its name and extension), the
rest is the file. Any input that breaks the property is saved under ``--crashes`` as
``<reader>-<sha1>.bin``; keep it as a regression test in tests/test_fuzz_readers.py.

Columns: executions, unique crashes (by exception type and place), the slowest input's
seconds, and the peak memory of one call (traced numpy/Python allocations).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "tests"))

import fuzz_targets as ft  # noqa: E402 - after the sys.path lines above

# Modules whose Python code atheris instruments for coverage. Not PIL: its decoders are C, and
# atheris 3.0 fails to rewrite the bytecode of some of its Python plugins (TiffImagePlugin).
INSTRUMENT = ["kiln", "pipeline", "worker", "app", "trimesh", "plyfile", "yaml", "json"]


class Stats:
    """What one reader's fuzzing saw; written to ``path`` as JSON now and then (libFuzzer ends
    the process itself when its time is up, so the last write is the answer)."""

    def __init__(self, path: Path, crashes: Path, reader: str):
        self.path, self.crashes, self.reader = path, crashes, reader
        self.executions = 0
        self.unique: dict[str, str] = {}
        self.slowest = 0.0
        self.peak_bytes = 0
        self.engine = ""
        self._written = 0.0

    def record(self, out: ft.Outcome | None, data: bytes, broken: ft.PropertyBroken | None) -> None:
        self.executions += 1
        if out is not None:
            self.slowest = max(self.slowest, out.seconds)
            self.peak_bytes = max(self.peak_bytes, out.traced_bytes)
        if broken is not None:
            key = _crash_key(broken)
            if key not in self.unique:
                name = f"{self.reader}-{hashlib.sha1(data).hexdigest()[:12]}.bin"
                self.crashes.mkdir(parents=True, exist_ok=True)
                (self.crashes / name).write_bytes(data)
                self.unique[key] = f"{name}: {str(broken).splitlines()[0][:200]}"
        if time.monotonic() - self._written > 0.5 or broken is not None:
            self.write()

    def write(self) -> None:
        self._written = time.monotonic()
        self.path.write_text(json.dumps({"reader": self.reader, "engine": self.engine,
                                         "executions": self.executions, "crashes": self.unique,
                                         "slowest_s": self.slowest, "peak_bytes": self.peak_bytes}))


def _crash_key(broken: ft.PropertyBroken) -> str:
    """Crashes are the same when the same exception type comes from the same line."""
    cause = broken.cause
    if cause is None or cause.__traceback__ is None:
        return str(broken).split(":")[1] if ":" in str(broken) else str(broken)
    last = traceback.extract_tb(cause.__traceback__)[-1]
    return f"{type(cause).__name__} at {Path(last.filename).name}:{last.lineno}"


def _one_input(target: ft.Target, seeds: list[ft.Seed], companions: dict[str, bytes],
               stats: Stats, raw: bytes) -> None:
    """Run one input: its first byte picks the seed it stands for, the rest is the file."""
    if not raw:
        return
    seed = seeds[raw[0] % len(seeds)]
    data = raw[1:]
    try:
        out = ft.run_reader(target, ft.Seed(seed.name, b"", companions), data)
        stats.record(out, raw, None)
    except ft.PropertyBroken as broken:
        stats.record(None, raw, broken)


def _companions(seeds: list[ft.Seed]) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for s in seeds:
        out.update(s.companions)
    return out


def run_atheris(target: ft.Target, seconds: float, stats: Stats, work: Path) -> None:
    import atheris

    with atheris.instrument_imports(include=INSTRUMENT):
        seeds = target.seeds()
        for s in seeds:   # imports what the reader uses, under instrumentation (slow the first time)
            try:
                ft.run_reader(target, s, s.data)
            except ft.PropertyBroken:
                pass   # the fuzzing below finds it again and saves it
    companions = _companions(seeds)
    corpus = work / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    for i, s in enumerate(seeds):
        (corpus / f"seed{i}").write_bytes(bytes([i]) + s.data)
    stats.engine = "atheris"
    max_len = max(len(s.data) for s in seeds) + 1024
    atheris.Setup([sys.argv[0], str(corpus), f"-max_total_time={int(seconds)}", "-timeout=0",
                   "-rss_limit_mb=4096", f"-max_len={max_len}", f"-artifact_prefix={work}/"],
                  lambda raw: _one_input(target, seeds, companions, stats, raw))
    atheris.Fuzz()


def run_mutations(target: ft.Target, seconds: float, stats: Stats) -> None:
    """The fallback: random mutation ops (``ft.random_ops``) over the seeds, until time is up."""
    seeds = target.seeds()
    companions = _companions(seeds)
    rng = random.Random(24)
    stats.engine = "mutate"
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        i = rng.randrange(len(seeds))
        other = rng.choice(seeds).data
        data = ft.mutate(seeds[i].data, ft.random_ops(rng, rng.randint(1, 6)), other)
        _one_input(target, seeds, companions, stats, bytes([i]) + data)


def child(reader: str, seconds: float, crashes: Path, stats_path: Path, engine: str) -> None:
    target = ft.targets()[reader]
    stats = Stats(stats_path, crashes, reader)
    if engine == "auto":
        try:
            import atheris  # noqa: F401
            engine = "atheris"
        except ImportError:
            engine = "mutate"
    if engine == "atheris":
        run_atheris(target, seconds, stats, stats_path.parent / f"{reader}-work")
    else:
        run_mutations(target, seconds, stats)
    stats.write()


def fuzz_reader(reader: str, seconds: float, crashes: Path, engine: str, tmp: Path) -> dict:
    """Fuzz one reader in a subprocess; its stats, with how the process ended."""
    stats_path = tmp / f"{reader}.json"
    cmd = [sys.executable, __file__, "--child", reader, "--seconds", str(seconds),
           "--crashes", str(crashes), "--stats", str(stats_path), "--engine", engine]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=seconds + 120)
        ended = "ok" if proc.returncode == 0 else f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}"
    except subprocess.TimeoutExpired:
        ended = "timeout"
    stats = json.loads(stats_path.read_text()) if stats_path.is_file() else \
        {"reader": reader, "engine": engine, "executions": 0, "crashes": {}, "slowest_s": 0.0, "peak_bytes": 0}
    stats["ended"] = ended
    return stats


def table(rows: list[dict]) -> str:
    lines = ["| reader | engine | executions | unique crashes | slowest input (s) | peak memory (MiB) |",
             "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['reader']} | {r['engine']} | {r['executions']} | {len(r['crashes'])} | "
                     f"{r['slowest_s']:.3f} | {r['peak_bytes'] / 2 ** 20:.1f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="fuzzing time per reader")
    ap.add_argument("--readers", default="", help="comma-separated; default: all of " + ", ".join(ft.targets()))
    ap.add_argument("--crashes", default="var/fuzz-crashes", help="folder for inputs that break a reader")
    ap.add_argument("--engine", choices=("auto", "atheris", "mutate"), default="auto")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--stats", help=argparse.SUPPRESS)
    args = ap.parse_args()
    crashes = Path(args.crashes).absolute()
    if args.child:
        child(args.child, args.seconds, crashes, Path(args.stats), args.engine)
        return
    import tempfile

    readers = [r for r in args.readers.split(",") if r] or list(ft.targets())
    rows = []
    with tempfile.TemporaryDirectory(prefix="kiln-fuzz-bench-") as tmp:
        for reader in readers:
            row = fuzz_reader(reader, args.seconds, crashes, args.engine, Path(tmp))
            rows.append(row)
            print(f"{reader}: {row['executions']} runs, {len(row['crashes'])} crashes ({row['ended']})",
                  file=sys.stderr, flush=True)
            for what in row["crashes"].values():
                print(f"  {what}", file=sys.stderr)
    print(table(rows))
    if os.environ.get("KILN_FUZZ_JSON"):
        Path(os.environ["KILN_FUZZ_JSON"]).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
