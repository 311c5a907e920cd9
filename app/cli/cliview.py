"""What ``kiln run`` shows: per-stage bars for one image, one line per image for several,
the timing table and the batch summary."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from kiln.formats import extra_keys, format_of
from kiln.records import JobStats


class ProgressLine:
    """Per-stage progress. On a terminal each stage gets one line whose bar is redrawn
    in place from empty to full; piped, a line when a stage starts and one when it ends."""

    WIDTH = 24

    def __init__(self, stream=None):
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty()
        self.stage = None      # the stage being shown
        self.ended = False     # that stage was shown complete
        self.open = False      # a terminal line still waits for its newline
        self.t0 = time.perf_counter()

    def update(self, stage: str, fraction: float, message: str = "") -> None:
        """``fraction``: 0..1 within ``stage`` (not over the whole job)."""
        fraction = max(0.0, min(1.0, fraction))
        new = stage != self.stage
        if new:
            self._end_line()
            self.stage, self.ended = stage, False
        if self.ended:
            return  # a stage may report 1.0 more than once; its line is finished
        self.ended = fraction >= 1.0
        elapsed = time.perf_counter() - self.t0
        if self.tty:
            filled = int(round(fraction * self.WIDTH))
            bar = "#" * filled + "-" * (self.WIDTH - filled)
            self.stream.write(f"\r\033[K{elapsed:6.1f}s  {stage:<13} [{bar}] {message[:40]}")
            self.open = not self.ended
            if self.ended:
                self.stream.write("\n")
        elif new or self.ended:
            self.stream.write(f"{elapsed:6.1f}s  {stage:<13} {message}\n")
        self.stream.flush()

    def note(self, text: str) -> None:
        """A line of its own (e.g. a retry); the next update starts a new stage line."""
        self._end_line()
        self.stage = None
        self.stream.write(f"{time.perf_counter() - self.t0:6.1f}s  {text}\n")
        self.stream.flush()

    def _end_line(self) -> None:
        if self.open:
            self.stream.write("\n")
            self.open = False


def timing_table(timings: dict, total: float, extra: dict | None = None) -> str:
    """Stage times in pipeline order, then ``extra`` rows (worker start, queue), then
    whatever else the run took, so the rows add up to ``total``."""
    rows = [(k, v) for k, v in timings.items() if not k.endswith("_s")]  # *_s: job-level
    rows += [(k, v) for k, v in (extra or {}).items() if v]
    other = total - sum(t for _, t in rows)
    if other >= 0.005:
        rows.append(("other", other))
    lines = [f"{'stage':<14}{'seconds':>9}", "-" * 23]
    lines += [f"{s:<14}{t:>9.2f}" for s, t in rows]
    lines += ["-" * 23, f"{'total':<14}{total:>9.2f}"]
    return "\n".join(lines)


@dataclass
class ItemResult:
    """How one image of a batch went."""

    image: Path
    output: Path
    state: str = "not run"     # done | failed | cancelled | not run
    seconds: float = 0.0
    error: str = ""
    timings: dict = field(default_factory=dict)
    stats: JobStats = field(default_factory=JobStats)
    ply: Path | None = None
    source: str = ""           # "" made now; "already done in job <id>" / "resumed job <id>" (--resume)
    files: list = field(default_factory=list)   # written_files: the model files, the GLB first

    def to_dict(self) -> dict:
        return {"image": str(self.image), "output": str(self.output.resolve()) if self.state == "done"
                else None, "state": self.state, "seconds": round(self.seconds, 3), "error": self.error,
                "timings": self.timings, "stats": self.stats.to_dict(),
                "ply": str(self.ply.resolve()) if self.ply else None, "source": self.source or None,
                "files": self.files}


def written_files(out: Path, result: dict, pipeline) -> list[dict]:
    """What a job left for the person, the GLB first: one dict per model file with its
    ``path`` here, ``format`` (as --format names it), ``bytes`` and what the job's export
    reported of it (``kiln.records.OutputFile``: vertices, faces, texture_format, units,
    scale, up). ``result``: a runner's answer ("extra": output key -> path); ``pipeline``:
    the job's ``PipelineStats`` (None when unknown)."""
    reported = {f.key: f for f in (pipeline.files if pipeline is not None else ())}
    paths = {"glb": Path(out), **{k: Path(p) for k, p in (result.get("extra") or {}).items()}}
    rows = []
    # a scene's files come one per object (``obj@bench``), after the formats' order
    for key in ["glb", *extra_keys(paths)]:
        path = paths[key]
        row = {k: v for k, v in reported[key].to_dict().items() if k not in ("key", "name")} \
            if key in reported else {}
        row.update(format=format_of(key), path=str(path.resolve()), bytes=path.stat().st_size)
        rows.append(row)
    if result.get("ply"):
        ply = Path(result["ply"])
        rows.append({"format": "gaussians", "path": str(ply.resolve()), "bytes": ply.stat().st_size})
    return rows



class BatchLine:
    """One line for one image of a batch. On a terminal it is redrawn in place (stage,
    bar, time) and ends with the outcome; piped, only the outcome is written."""

    WIDTH = 16

    def __init__(self, index: int, total: int, name: str, stream=None):
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty()
        self.prefix = f"[{index}/{total}] {name}"
        self.t0 = time.perf_counter()
        self.drawn = False

    def update(self, stage: str, fraction: float, message: str = "") -> None:
        if not self.tty:
            return
        fraction = max(0.0, min(1.0, fraction))
        filled = int(round(fraction * self.WIDTH))
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        self.stream.write(f"\r\033[K{self.prefix}  {stage:<13} [{bar}] "
                          f"{time.perf_counter() - self.t0:6.1f}s")
        self.stream.flush()
        self.drawn = True

    def note(self, text: str) -> None:
        """Retries and the like: shown in place on a terminal, left to the summary otherwise."""
        if self.tty:
            self.stream.write(f"\r\033[K{self.prefix}  {text[:60]}")
            self.stream.flush()
            self.drawn = True

    def finish(self, r: ItemResult) -> None:
        if r.state == "done":
            others = [Path(f["path"]).name for f in r.files[1:]]
            what = f"done    {r.seconds:6.1f}s  -> {r.output}" + (f" + {', '.join(others)}" if others else "") \
                + (f"  ({r.source})" if r.source else "")
        else:
            what = f"{r.state:<7} {r.seconds:6.1f}s  {r.error}"
        self.stream.write(("\r\033[K" if self.drawn else "") + f"{self.prefix}  {what}\n")
        self.stream.flush()


def summary_table(results: list[ItemResult], total: float, startup: float = 0.0) -> str:
    """Image, outcome, seconds, faces and the GLB (or why not), one row each, then counts."""
    name_w = max([len("image")] + [len(r.image.name) for r in results])
    lines = [f"{'image':<{name_w}}  {'result':<9} {'seconds':>8} {'faces':>7}  output / reason"]
    lines.append("-" * (len(lines[0]) + 10))
    for r in results:
        pipeline = r.stats.pipeline
        faces = pipeline.faces if r.state == "done" and pipeline is not None else "-"
        tail = str(r.output) if r.state == "done" else (r.error or "")
        secs = f"{r.seconds:8.1f}" if r.state != "not run" else f"{'-':>8}"
        lines.append(f"{r.image.name:<{name_w}}  {r.state:<9} {secs} {faces!s:>7}  {tail}")
    counts: dict = {}
    for r in results:
        counts[r.state] = counts.get(r.state, 0) + 1
    order = ("done", "failed", "cancelled", "not run")
    said = ", ".join(f"{counts[s]} {s}" for s in order if s in counts)
    n = len(results)
    foot = f"{n} image{'s' if n != 1 else ''}: {said}; {total:.1f} s in all"
    if startup:
        foot += f" (worker start {startup:.1f} s)"
    lines += ["-" * len(lines[1]), foot]
    return "\n".join(lines)
