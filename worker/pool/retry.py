"""Whether a failed attempt is tried again, and how: one pure function over a record of
what happened.

The dispatcher describes a failure (``Failure``: what kind, the sentence saying so, and
what it knows about the job's earlier attempts) and does whatever ``decide`` returns;
every rule about retrying lives here, so the whole policy reads, and is tested, as one
table:

=========================  =====================================================
kind                       decision
=========================  =====================================================
cancel                     cancelled
input                      failed (the same input fails the same way again)
oom                        once: again with chunk scale ``OOM_CHUNK_SCALE``; then failed
error                      once, if it ran on the GPU and no backend was changed yet:
                           again with ``FALLBACK``; else failed
crash, hang, frozen, cuda  once: again with ``FALLBACK``; failed when retries are off
                           (``worker.retry_with_fallback``), when this was that retry,
                           or when the input has crashed a worker before
=========================  =====================================================

A retry that crosses a cancel (the user cancelled while the failure was on its way)
ends the job cancelled instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Mapping, Optional

from kiln.records import Backends

# Settings a crashed job is retried with: the CPU twin of every GPU backend.
FALLBACK = {"views.backend": "cpu", "rasterize.backend": "moderngl", "worker.device": "cpu"}
FALLBACK_TEXT = "CPU renderer, moderngl rasterizer, CPU device"
OOM_CHUNK_SCALE = 0.5
CANCELLED_BY_USER = "cancelled by user"

FailureKind = Literal["crash", "hang", "frozen", "cuda", "oom", "error", "input", "cancel"]
# Failures that took the worker process with them; each counts against the input.
CRASH_KINDS = frozenset({"crash", "hang", "frozen", "cuda"})


@dataclass(frozen=True)
class Failure:
    """What happened to one attempt, and what the job's earlier attempts did.

    why: the sentence saying what happened ("worker crashed with SIGSEGV during stage
        'bake'"). error: the first line of the worker's error, for failures it reported.
    crash_count: how often this input has crashed a worker, this time included (0 when
        unknown). previous: why the last retried attempt failed, if one was.
    crash_retried / oom_retried / error_retried: that kind of retry already happened.
    has_overrides: the attempt already ran with changed settings (a retry's).
    chunk_scale: the attempt's. retry_allowed: ``worker.retry_with_fallback``.
    """

    kind: FailureKind
    why: str
    error: str = ""
    used_gpu: bool = False
    crash_count: int = 0
    crash_retried: bool = False
    oom_retried: bool = False
    error_retried: bool = False
    has_overrides: bool = False
    chunk_scale: float = 1.0
    cancel_requested: bool = False
    cancel_reason: str = ""     # what the canceller said; "" = the person (``CANCELLED_BY_USER``)
    retry_allowed: bool = True
    previous: str = ""


@dataclass(frozen=True)
class Decision:
    """action 'retry': queue the job again (front of the queue) with ``overrides`` /
    ``chunk_scale`` where not None, and remember ``retried`` (the kind of retry this is);
    'fail' / 'cancel': end the job that way. ``message``: the job's status message (a
    failure's error); ``log``: the line for the job's log, when it differs."""

    action: Literal["retry", "fail", "cancel"]
    message: str
    log: str = ""
    overrides: Optional[Mapping[str, object]] = None
    chunk_scale: Optional[float] = None
    retried: Optional[Literal["crash", "oom", "error"]] = None


def decide(f: Failure) -> Decision:
    """The decision for ``f``; see the module docstring for the table."""
    if f.kind == "cancel":
        return Decision("cancel", f.cancel_reason or CANCELLED_BY_USER,
                        log="cancelled: the worker running it was stopped")
    if f.kind == "input":
        return Decision("fail", f.why)
    if f.kind == "oom":
        if f.oom_retried:
            return Decision("fail", f"{f.why}, also after retrying with chunk scale {f.chunk_scale:g}: "
                                    f"{f.error}")
        return _retry(f, f"retrying once with chunk scale {OOM_CHUNK_SCALE:g}",
                      chunk_scale=OOM_CHUNK_SCALE, retried="oom")
    if f.kind == "error":
        if f.used_gpu and f.retry_allowed and not f.error_retried and not f.has_overrides:
            return _retry(f, f"retrying once with safe backends ({FALLBACK_TEXT})",
                          overrides=FALLBACK, retried="error")
        return Decision("fail", f.why)
    if f.kind in CRASH_KINDS:
        if not f.retry_allowed:
            return Decision("fail", f.why)
        if f.crash_retried:
            return Decision("fail", f"{f.why}; this was the retry with safe backends after: "
                                    f"{f.previous}; not retried again")
        if f.crash_count > 1:
            return Decision("fail", f"{f.why}; not retried: this input has now crashed a worker "
                                    f"{f.crash_count} times")
        return _retry(f, f"retrying once with safe backends ({FALLBACK_TEXT})",
                      overrides=FALLBACK, retried="crash")
    raise ValueError(f"unknown failure kind {f.kind!r}")


def _retry(f: Failure, what: str, **how) -> Decision:
    if f.cancel_requested:
        return Decision("cancel", f.cancel_reason or CANCELLED_BY_USER,
                        log=f"{f.why}; not retried: the job was cancelled")
    return Decision("retry", f"{f.why}; {what}", **how)


def used_gpu(backends: Optional[Backends]) -> bool:
    """Whether an attempt that reported these backends ran anything on the GPU (None: it
    reported none, it never got that far)."""
    return backends is not None and (backends.device.startswith("cuda") or backends.render == "gsplat"
                                     or backends.rasterize == "nvdiffrast")
