"""Running ``kiln run``'s jobs: one worker for all the images of a run (or the stages in
this process with ``--in-process``), Ctrl-C as a cancel, outcomes as exceptions with
the exit status they stand for."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import TYPE_CHECKING

from kiln.formats import EXTRA_OUTPUTS, base_key, copy_output, output_path
from kiln.records import JobStats
from worker.jobs.bakejob import copy_fit_files
from worker.jobs.inputs import Loaded, NoSpace, no_space, writing_to

if TYPE_CHECKING:
    from worker.jobs.bakeinputs import CheckedBake
    from worker.pool.supervisor import Supervisor

# How long Ctrl-C waits for the cancelled job's worker to exit (it is sent SIGTERM, and
# SIGKILL a second later, so this is only reached when the machine is badly overloaded).
CANCEL_WAIT_S = 120.0

_NO_SPACE = re.compile(r"No space left on device(?:: '([^']+)')?|Disk quota exceeded(?:: '([^']+)')?")


class CliError(Exception):
    """A problem the user can fix; printed without a traceback."""

    exit_code = 2


class CliJobFailed(CliError):
    """The job ran and failed (or no worker could run it)."""

    exit_code = 1


class Cancelled(CliError):
    """Ctrl-C: the job was cancelled."""

    exit_code = 130


def _copy_atomic(src, dst: Path, key: str = "glb") -> None:
    """Copy a job's output ``key`` so an interrupted copy never leaves a torn file at ``dst``
    (an OBJ zip's members named after ``dst``: ``kiln.formats.copy_output``)."""
    with writing_to(dst.parent):
        copy_output(key, src, dst)


def write_report(path: str, data: dict) -> None:
    """``--report``: ``data`` as JSON at ``path`` (a full disk named)."""
    import json

    with writing_to(Path(path).parent):
        Path(path).write_text(json.dumps(data, indent=2, default=str))


def show_events(events, display) -> None:
    """Feed each stage's own progress to ``display`` (``update``/``note``); say it when an
    attempt is retried."""
    was = None
    for ev in events:
        if ev.state == "queued" and was == "running":
            display.note(ev.message)   # why the attempt failed and how it is retried
        elif ev.state == "running" and ev.stage:
            message = ev.message.removeprefix(f"{ev.stage}: ")
            display.update(ev.stage, ev.stage_progress, message)
        was = ev.state


class WorkerRunner:
    """One supervisor, started once, runs every job of the invocation in turn."""

    def __init__(self, settings, resume: bool = False):
        self.settings = settings
        self.jobs_dir = Path(settings.app.jobs_dir)
        self.sup: "Supervisor | None" = None
        self.startup = 0.0
        self.t0 = 0.0   # perf_counter when start_early spawned the worker (0: it did not)
        # --resume: an image this command's job store has done (or has waiting after a
        # restart) with the same settings is taken from there instead of made again
        self.resume = resume

    def start_early(self) -> None:
        """Spawn the worker now and do not wait for it: its interpreter, torch and probes
        (~2 s) run while this process reads and checks the inputs. Whatever goes wrong here
        is left for ``start`` to meet again and report, after the inputs' own problems
        (a full disk is named by the space check, not by a worker that could not log).
        A caller that refuses the inputs calls ``close``: the worker is stopped, no job made."""
        from worker.pool.supervisor import Supervisor

        self.t0 = time.perf_counter()
        sup = Supervisor(self.settings, jobs_dir=self.jobs_dir, cache_dir=Path(self.settings.app.cache_dir))
        try:
            sup.start(wait=False)
        except Exception:  # noqa: BLE001 - start() tries again and says what is wrong
            sup.shutdown()
            return
        self.sup = sup

    def start(self) -> float:
        """The worker ready (started now, or waited for after ``start_early``); returns the
        seconds this took, from the early start when there was one."""
        from worker.pool.supervisor import Supervisor, WorkerStartError

        early = self.sup is not None
        t0 = self.t0 if early else time.perf_counter()
        if not early:
            self.sup = Supervisor(self.settings, jobs_dir=self.jobs_dir,
                                  cache_dir=Path(self.settings.app.cache_dir))
        assert self.sup is not None
        try:
            with writing_to(self.jobs_dir):
                if early:
                    self.sup.wait_ready()
                else:
                    self.sup.start()   # on failure (or Ctrl-C) it has already stopped what it started
        except WorkerStartError as e:
            self._stop_failed(early)
            raise CliJobFailed(f"the worker could not start: {e}") from None
        except BaseException:
            self._stop_failed(early)
            raise
        self.startup = time.perf_counter() - t0
        return self.startup

    def _stop_failed(self, early: bool) -> None:
        if early and self.sup is not None:   # start(wait=False) leaves stopping to its caller
            self.sup.shutdown()
        self.sup = None

    def close(self) -> None:
        if self.sup is not None:
            self.sup.shutdown()
            self.sup = None

    def run(self, item: Loaded, out: Path, display) -> dict:
        """Run one image's job and copy its GLB (and .ply, and the other formats beside it) to
        ``out``. Returns timings, stats (a ``kiln.records.JobStats``), ply, extra (output key ->
        path) and queued; raises CliError / CliJobFailed /
        Cancelled / NoSpace."""
        source = ""

        def submit(sup):
            nonlocal source
            found = sup.find(item.rgb, item.mask, self.settings, session="cli") if self.resume else None
            if found is None:
                return sup.submit(item.rgb, item.mask, self.settings, session="cli")
            done = found.status().state == "done"
            source = f"already done in job {found.id}" if done else f"resumed job {found.id}"
            display.note(source)
            return found

        return {**self._follow(submit, out, display), "source": source}

    def bake(self, bake: "CheckedBake", out: Path, display) -> dict:
        """Run a bake job (``worker.jobs.bakeinputs.CheckedBake``) and copy its GLB to ``out``;
        returns and raises as ``run``."""
        return self._follow(lambda sup: sup.submit_bake(bake, self.settings, session="cli"), out, display)

    def _follow(self, submit, out: Path, display) -> dict:
        sup = self.sup
        try:
            with writing_to(self.jobs_dir):
                job = submit(sup)
        except ValueError as e:
            raise CliError(f"the job was refused: {e}") from None
        try:
            show_events(job.follow(), display)
        except KeyboardInterrupt:
            display.note("interrupted: cancelling the job (Ctrl-C again to stop at once)")
            self._cancel(job)
        st = job.status()
        if st.state != "done":
            error = st.error or st.message
            where = f"job {job.id} {st.state}: {error} (log: {job.dir / 'log'})"
            full = _NO_SPACE.search(error or "")
            if full:
                path = full.group(1) or full.group(2)
                raise NoSpace(f"{no_space(Path(path).parent if path else self.jobs_dir)}; {where}")
            # a stage refusing the input is the user's to fix, as in --in-process
            kind = CliError if "StageInputError:" in error else CliJobFailed
            raise kind(where)
        _copy_atomic(st.outputs["glb"], out)
        ply = None
        if st.outputs.get("ply"):
            ply = out.with_suffix(".ply")
            _copy_atomic(st.outputs["ply"], ply)
        extra = {}
        for key in st.outputs:   # beside the GLB, named after it (kiln.formats); a scene's, one per object
            if base_key(key) in EXTRA_OUTPUTS and st.outputs.get(key):
                extra[key] = output_path(out, key)
                _copy_atomic(st.outputs[key], extra[key], key)
        with writing_to(out.parent):
            fit_files = copy_fit_files(Path(st.outputs["glb"]).parent, out)
        return {"timings": st.timings, "stats": st.stats, "ply": ply, "extra": extra, "fit_files": fit_files,
                "queued": st.timings.get("queued_s", 0.0)}

    def _cancel(self, job) -> None:
        """Cancel ``job`` (a ``worker.pool.jobhandle.Job``) and wait until its worker has exited
        (the job then ends cancelled); a second Ctrl-C stops waiting."""
        job.cancel(timeout=CANCEL_WAIT_S)
        st = job.status()
        if st.state == "cancelled":
            raise Cancelled(f"cancelled job {job.id}; the worker running it was stopped") from None
        if not st.terminal:
            raise Cancelled(f"interrupted; job {job.id} was still {st.state} {CANCEL_WAIT_S:.0f} s "
                            "after it was cancelled; its worker is stopped now") from None
        raise Cancelled(f"interrupted; job {job.id} had already ended ({st.state})") from None


class InProcessRunner:
    """The stages in this process (debugging: a crash takes the CLI with it)."""

    startup = 0.0
    t0 = 0.0   # no early start

    def __init__(self, settings):
        self.settings = settings

    def start(self) -> float:
        return 0.0

    def close(self) -> None:
        pass

    def run(self, item: Loaded, out: Path, display) -> dict:
        from worker.child.inprocess import run_in_process

        with writing_to(out.parent):
            res = run_in_process(item.rgb, item.mask, self.settings, out, on_event=display.update,
                                 cache_dir=Path(self.settings.app.cache_dir))
        # the same stats a worker's job has, without the job's own (no queue, no worker)
        return {**res, "stats": JobStats(pipeline=res["stats"]), "queued": 0.0}

    def bake(self, bake: "CheckedBake", out: Path, display) -> dict:
        from worker.child.inprocess import bake_in_process

        with writing_to(out.parent):
            res = bake_in_process(bake, self.settings, out, on_event=display.update)
        return {**res, "stats": JobStats(pipeline=res["stats"]), "queued": 0.0}
