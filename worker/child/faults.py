"""Fault injection for tests: make a worker crash, hang or raise at a named stage.

Switched on only by the environment variable ``KILN_TEST_FAULTS`` or by passing a
``FaultPlan`` to ``Supervisor(faults=...)``; no CLI flag, setting or UI control
reaches it. The supervisor picks a fault per job attempt and sends its spec
(``"segv@bake"``) with the job; the worker fires it from its stage-start event
callback, so ``pipeline/`` itself carries no fault code.

Spec grammar, comma-separated rules::

    KIND@STAGE[:attempt=N][:session=NAME][:input=HEX][:seed=N]

KIND is one of ``KINDS``; STAGE a pipeline stage name, or ``probe:NAME`` for a
start-up backend probe (``worker.child.probe.PROBES``) or ``probe:imports`` for the
start-up step after the probes, where a worker imports the stages' libraries
(a native library crashing on load); ``attempt`` limits the rule to
that attempt of a job (1 = first run, 2 = the retry), or for a probe rule to that
start of the worker slot (1 = its first worker); ``session`` to jobs submitted
under that session name; ``input`` to jobs whose input digest (``kiln.digest``: image
and mask) starts with HEX, the way one bad photo in a batch trips a library; ``seed`` to
jobs whose settings' ``seed`` is N (a browser test picks out its own job by the page's Seed
box, where it cannot know its session or input).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Iterable, Optional

ENV_VAR = "KILN_TEST_FAULTS"
PROBE_PREFIX = "probe:"

KINDS = {
    "error": "the stage raises RuntimeError (a stage's bug; the worker survives)",
    "segv": "invalid memory read (SIGSEGV)",
    "abort": "abort() (SIGABRT)",
    "exit": "process exits with status 3",
    "torn_write": "SIGKILL half way through an atomic write of a file in the job's folder",
    "hang": "the stage sleeps forever; heartbeats keep coming",
    "freeze": "the whole process stops (SIGSTOP): no heartbeats, SIGTERM is not delivered",
    "cuda": "RuntimeError 'CUDA error: an illegal memory access was encountered'",
    "oom": "torch.cuda.OutOfMemoryError",
    "cuda_assert": "a real device-side assert: a CUDA gather with an out-of-range index (kiln selftest)",
}


@dataclass(frozen=True)
class Fault:
    kind: str
    stage: str
    attempt: Optional[int] = None
    session: Optional[str] = None
    input: Optional[str] = None
    seed: Optional[int] = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; choose one of {', '.join(KINDS)}")
        if not re.fullmatch(r"(probe:)?[a-z_][a-z0-9_]*", self.stage or ""):
            raise ValueError(f"fault stage {self.stage!r} must be a stage name or probe:NAME")
        if self.kind == "torn_write" and self.stage.startswith(PROBE_PREFIX):
            # a start-up step has no job folder to leave the half-written file in, and nothing
            # would clean one left in the worker's working directory
            raise ValueError(f"fault kind 'torn_write' tears a write in a job's folder: give it a job stage, "
                             f"not {self.stage!r}")

    @property
    def spec(self) -> str:
        """What crosses the queue to the worker: ``kind@stage``."""
        return f"{self.kind}@{self.stage}"

    def matches(self, session: str, attempt: int, digest: str = "", seed: Optional[int] = None) -> bool:
        return ((self.attempt is None or self.attempt == attempt)
                and (self.session is None or self.session == session)
                and (self.input is None or digest.startswith(self.input))
                and (self.seed is None or self.seed == seed))


def parse(text: str) -> list[Fault]:
    """Parse the spec grammar above; raises ValueError naming the bad rule."""
    rules = []
    for raw in (text or "").split(","):
        raw = raw.strip()
        if not raw:
            continue
        head, *opts = re.split(r":(?=\w+=)", raw)  # "probe:NAME" keeps its colon
        if "@" not in head:
            raise ValueError(f"fault rule {raw!r} must look like KIND@STAGE")
        kind, stage = head.split("@", 1)
        kw: dict = {}
        for opt in opts:
            name, _, value = opt.partition("=")
            if name == "attempt" and value.isdigit():
                kw["attempt"] = int(value)
            elif name == "session" and value:
                kw["session"] = value
            elif name == "input" and re.fullmatch(r"[0-9a-f]{4,64}", value):
                kw["input"] = value
            elif name == "seed" and value.isdigit():
                kw["seed"] = int(value)
            else:
                raise ValueError(f"fault rule {raw!r}: unknown option {opt!r}")
        rules.append(Fault(kind.strip(), stage.strip(), **kw))
    return rules


class FaultPlan:
    """The rules a supervisor applies; the first matching rule wins."""

    def __init__(self, rules: Iterable[Fault | str] = ()):
        self.rules: list[Fault] = []
        for r in rules:
            self.rules.extend(parse(r) if isinstance(r, str) else [r])

    @classmethod
    def from_env(cls) -> Optional["FaultPlan"]:
        text = os.environ.get(ENV_VAR, "")
        return cls(parse(text)) if text.strip() else None

    def pick(self, session: str, attempt: int, digest: str = "", seed: Optional[int] = None) -> Optional[str]:
        for rule in self.rules:
            if not rule.stage.startswith(PROBE_PREFIX) and rule.matches(session, attempt, digest, seed):
                return rule.spec
        return None

    def probe_faults(self, start: Optional[int] = None) -> dict[str, str]:
        """{probe name: fault kind} for rules on ``probe:NAME`` stages: they fire while a
        worker starts, in that backend probe, every time until the probe is skipped. On a
        probe rule ``attempt=N`` means the N-th start of that worker slot (``start``)."""
        return {r.stage[len(PROBE_PREFIX):]: r.kind for r in self.rules
                if r.stage.startswith(PROBE_PREFIX)
                and (r.attempt is None or start is None or r.attempt == start)}


def split_spec(spec: str) -> tuple[str, str]:
    kind, _, stage = spec.partition("@")
    return kind, stage


def fire(kind: str, job_dir: Optional[str] = None) -> None:
    """Make the calling (worker) process fail the way ``kind`` says. Only returns by raising
    for ``error``, ``cuda`` and ``oom``; never returns for the others. ``torn_write`` needs
    ``job_dir``, the folder it leaves its half-written temporary in (``Fault`` refuses it for
    a start-up step, which has none)."""
    import signal
    import time

    if kind == "error":
        raise RuntimeError("injected fault: a stage raised an ordinary exception")
    if kind == "segv":
        import ctypes

        ctypes.string_at(0)  # a genuine NULL read, as a broken native extension would do
        os.kill(os.getpid(), signal.SIGSEGV)  # not reached on Linux; belt and braces
    elif kind == "abort":
        os.abort()
    elif kind == "exit":
        os._exit(3)
    elif kind == "torn_write":
        from kiln.atomic import atomic_write

        def half_then_die(f) -> None:
            f.write(b'{"half": ')
            f.flush()
            os.kill(os.getpid(), signal.SIGKILL)

        atomic_write(os.path.join(job_dir or ".", "result.json"), half_then_die)
    elif kind == "hang":
        while True:
            time.sleep(3600)
    elif kind == "freeze":
        os.kill(os.getpid(), signal.SIGSTOP)
        while True:  # if someone sends SIGCONT, stay hung
            time.sleep(3600)
    elif kind == "cuda":
        raise RuntimeError("CUDA error: an illegal memory access was encountered\n"
                           "CUDA kernel errors might be asynchronously reported at some other "
                           "API call, so the stacktrace below might be incorrect. (injected fault)")
    elif kind == "cuda_assert":
        import torch

        # a genuine sticky error: the context is poisoned and only a new process recovers
        x = torch.zeros(4, device="cuda")
        x[torch.tensor([1 << 20], device="cuda")].sum().item()
        torch.cuda.synchronize()
        raise RuntimeError("cuda_assert fault: the out-of-range index raised no CUDA error")
    elif kind == "oom":
        import torch

        raise torch.cuda.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 2.00 GiB (injected fault)")
    else:
        raise ValueError(f"unknown fault kind {kind!r}")
