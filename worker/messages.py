"""What the supervisor and a worker say to each other over the worker's two queues.

Each message is a frozen dataclass; the queue pickles it by reference to this module,
so both ends must import it under the same name. They do: the worker, even under
another interpreter (``worker.python``), imports Kiln's own source tree
(``worker.child.interpreter.adopt_path``) before it reads its first message. Standard
library and ``kiln.records`` (the typed records some messages carry) only, and nothing
here may change between the two ends of one run.

A worker's messages stay small (``worker.child.process.Sender`` caps them under PIPE_BUF);
everything big goes through the job directory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from kiln.records import Backends, Capabilities

# How a job's attempt failed, as the worker classifies it (``process.classify_error``):
# oom: CUDA out of memory (the process is fine); cuda: a sticky CUDA error (the process
# exits); input: the stage refused its input or settings; error: anything else.
ErrorKind = Literal["oom", "cuda", "input", "error"]


# --------------------------------------------------------------------------- supervisor -> worker


@dataclass(frozen=True)
class Run:
    """Run one attempt of a job. ``overrides``: settings changed for this attempt only
    (the safe backends of a retry); ``fault``: a test fault spec, or None; ``kind``: the
    job's kind (``worker.jobs.jobstore.JobKind``: "image", "bake" or "fit")."""

    job: str
    dir: str
    attempt: int
    overrides: dict[str, Any] = field(default_factory=dict)
    chunk_scale: float = 1.0
    cache_dir: Optional[str] = None
    fault: Optional[str] = None
    kind: str = "image"


@dataclass(frozen=True)
class Stop:
    """Finish up and exit (only sent to an idle worker)."""


# --------------------------------------------------------------------------- worker -> supervisor


@dataclass(frozen=True)
class Heartbeat:
    t: float


@dataclass(frozen=True)
class Probing:
    """A start-up probe begins; ``name`` None: probing is over (the stage libraries load)."""

    name: Optional[str]


@dataclass(frozen=True)
class Ready:
    """Probing is over: what works here (``caps``), after ``startup_s`` seconds."""

    pid: int
    caps: Capabilities
    startup_s: float


@dataclass(frozen=True)
class Started:
    """The attempt has its settings and inputs; ``backends`` it resolved to use."""

    job: str
    backends: Backends


@dataclass(frozen=True)
class Progress:
    """``fraction`` (0..1) of ``stage`` is done."""

    job: str
    stage: str
    fraction: float
    message: str = ""


@dataclass(frozen=True)
class Done:
    """The attempt wrote its GLB (and result.json); ``ply`` when one was asked for; ``extra``:
    the other formats it wrote beside the GLB, output key -> path (``kiln.formats``). A fit
    job writes no GLB (``glb`` None): ``extra`` holds its camera and picture
    (``worker.jobs.bakejob.FIT_OUTPUTS``)."""

    job: str
    glb: Optional[str]
    ply: Optional[str] = None
    extra: Optional[dict[str, str]] = None


@dataclass(frozen=True)
class Failed:
    """The attempt raised; ``stage`` it was in (None before the first)."""

    job: str
    stage: Optional[str]
    kind: ErrorKind
    error: str

