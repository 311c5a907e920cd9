"""A soak under random faults: N jobs from several script clients through a real server,
while an injector sends SIGSEGV, SIGKILL and SIGSTOP to random workers and kills and
restarts the server itself a few times. At the end: a table of what became of every job
and what was left behind (issue 24 item 2).

    .venv/bin/python bench/soak.py [--jobs 200] [--clients 4] [--restarts 3] [--seed 0]

Each client is a ``gradio_client.Client`` with a browser cookie of its own, kept across
server restarts (the cookie names the browser; jobs belong to it), so after a restart it
finds its job with ``/status`` and follows it to the end: a job the dead server left is
resumed by the next one (``worker.resume_interrupted``). Lost = a job a client started that
never reached done or failed-with-a-reason; stuck = not ended when the run is over. Both
must be 0, as must orphan worker processes, temporary files left in the job store and
cache, and job folders whose status does not parse. The server's memory is sampled; its
growth over the second half of the run (after the last restart) must stay within 10 %.
``tests/test_soak.py`` runs a short version (20 jobs).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CONFIG = """
reconstruct: {{resolution: 64, num_gaussians: 2000, max_image_side: 256}}
views: {{count: 4, resolution: 128}}
mesh: {{simplify_ratio: 0.9}}
bake: {{enabled: false}}
worker: {{count: {workers}, device: cpu, stall_timeout_s: 5, heartbeat_s: 0.5, max_queue: 64}}
app: {{jobs_dir: {var}/jobs, cache_dir: {var}/cache, orphan_grace_s: 3600}}
"""
FAULTS = ("SIGSEGV", "SIGKILL", "SIGSTOP")


# --------------------------------------------------------------------------- the server

@dataclass
class Server:
    """``python -m app`` as a person starts it, in a session of its own (so workers a
    killed server leaves stopped get SIGHUP and SIGCONT from the kernel, as on any host)."""

    work: Path
    workers: int = 2
    port: int = 0
    proc: Optional[subprocess.Popen] = None
    generation: int = 0          # how many times it was started: a client's calls end with it
    seen_workers: set = field(default_factory=set)
    rss: list = field(default_factory=list)       # (time, MB) of the current server

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def start(self, timeout: float = 180.0) -> None:
        cfg = self.work / "soak.yaml"
        cfg.write_text(CONFIG.format(var=self.work / "var", workers=self.workers))
        if not self.port:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                self.port = s.getsockname()[1]
        env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
        env.pop("KILN_AUTH", None)
        env.pop("KILN_TEST_FAULTS", None)
        log = open(self.work / "server.log", "a")
        self.proc = subprocess.Popen([sys.executable, "-m", "app", "--port", str(self.port), "--config", str(cfg)],
                                     cwd=self.work, env=env, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.rss = []
        self.generation += 1
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}; see {self.work / 'server.log'}")
            if self.up():
                return
            time.sleep(0.3)
        raise RuntimeError(f"the server did not answer within {timeout:.0f} s")

    def up(self) -> bool:
        try:
            with urllib.request.urlopen(self.url, timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def kill(self) -> None:
        """kill -9, the worst case: no shutdown code runs."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def worker_pids(self) -> list[int]:
        """The server's spawned workers now (remembered, to look for orphans at the end)."""
        pids = [p for p, ppid, cmd in _processes() if self.proc and ppid == self.proc.pid and b"spawn_main" in cmd]
        self.seen_workers.update(pids)
        return pids

    def sample_memory(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            mb = _rss_mb(self.proc.pid)
            if mb:
                self.rss.append((time.monotonic(), mb))


def _processes():
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            yield int(d.name), ppid, (d / "cmdline").read_bytes().replace(b"\0", b" ")
        except (OSError, IndexError, ValueError):
            continue


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


# --------------------------------------------------------------------------- clients

@dataclass
class Outcome:
    """What became of one job a client started: ``state`` done | failed | lost."""

    client: int
    index: int
    state: str
    job: Optional[str] = None
    reason: str = ""


def _photo(folder: Path, index: int) -> Path:
    """A distinct RGBA photo per job (its transparency is the mask)."""
    import numpy as np
    from PIL import Image

    from kiln.examples import draw_object

    rgb, mask = draw_object(160, kind="toy" if index % 2 else "pebble", seed=index)
    path = folder / f"soak-{index}.png"
    Image.fromarray(np.dstack([rgb, np.where(mask, 255, 0).astype(np.uint8)]), "RGBA").save(path)
    return path


class Client:
    """One script client: a cookie for its whole life, a ``gradio_client.Client`` made again
    whenever the server went away."""

    def __init__(self, index: int, server: Server, folder: Path, deadline: float):
        self.index, self.server, self.folder, self.deadline = index, server, folder, deadline
        self.cookie = secrets.token_urlsafe(32)
        self._client = None

    def _connect(self):
        from gradio_client import Client as GradioClient

        while time.monotonic() < self.deadline:
            if self.server.up():
                try:
                    self._client = GradioClient(self.server.url, verbose=False, download_files=False,
                                                headers={"Cookie": f"kiln_browser={self.cookie}"})
                    return self._client
                except Exception:  # noqa: BLE001 - the server is (re)starting
                    pass
            time.sleep(1.0)
        raise TimeoutError("the server did not come back")

    def _call(self, c, *args, api_name: str, timeout: float = 60.0):
        """One call, given up after ``timeout`` or when the server it went to is gone."""
        gen = self.server.generation
        job = c.submit(*args, api_name=api_name)
        t0 = time.monotonic()
        while not job.done():
            if self.server.generation != gen or time.monotonic() - t0 > timeout:
                job.cancel()
                raise ConnectionError(f"{api_name}: the server went away")
            time.sleep(0.1)
        return job.result()

    def run(self, index: int) -> Outcome:
        """Upload a photo, generate, follow the job to its end through restarts."""
        photo = _photo(self.folder, index)
        job_id: Optional[str] = None
        known = self._known_jobs()
        while time.monotonic() < self.deadline:
            try:
                c = self._client or self._connect()
                if job_id is None:
                    return self._generate(c, photo, index)
                return self._follow(c, job_id, index)
            except Exception as e:  # noqa: BLE001 - sorted below
                text = str(e)
                job_id = job_id or self._started_since(known)
                if (" failed: " in text or " cancelled: " in text) and job_id:
                    return Outcome(self.index, index, "failed", job_id, text)
                self._client = None   # the server went away (or refused): connect again
                time.sleep(0.5)
        return Outcome(self.index, index, "lost", job_id, "the soak's deadline passed")

    def _generate(self, c, photo: Path, index: int) -> Outcome:
        from gradio_client import handle_file

        self._call(c, handle_file(str(photo)), api_name="/upload_image")
        gen = self.server.generation
        job = c.submit(api_name="/generate")
        while not job.done():
            if self.server.generation != gen or time.monotonic() > self.deadline:
                job.cancel()
                raise ConnectionError("/generate: the server went away")
            time.sleep(0.2)
        status = job.result()[0]   # raises for a failed or cancelled job, with its reason
        return Outcome(self.index, index, "done", status.get("job"))

    def _jobs(self, c) -> list:
        return self._call(c, api_name="/status")["jobs"]

    def _known_jobs(self) -> set:
        try:
            return {s["job"] for s in self._jobs(self._client or self._connect())}
        except Exception:  # noqa: BLE001 - the server is restarting; none known then
            return set()

    def _started_since(self, known: set) -> Optional[str]:
        """The job this client's last /generate made, if the server got that far."""
        try:
            jobs = [s["job"] for s in self._jobs(self._client or self._connect()) if s["job"] not in known]
        except Exception:  # noqa: BLE001
            return None
        return jobs[-1] if jobs else None

    def _follow(self, c, job_id: str, index: int) -> Outcome:
        while time.monotonic() < self.deadline:
            statuses = {s["job"]: s for s in self._jobs(c)}
            st = statuses.get(job_id)
            if st is None:
                return Outcome(self.index, index, "lost", job_id, "the job is not in /status")
            if st["state"] == "done":
                return Outcome(self.index, index, "done", job_id)
            if st["state"] in ("failed", "cancelled"):
                reason = st.get("error") or ""
                return Outcome(self.index, index, "failed" if reason else "lost", job_id,
                               reason or "ended without a reason")
            time.sleep(0.5)
        return Outcome(self.index, index, "lost", job_id, "the soak's deadline passed")


# --------------------------------------------------------------------------- the run

@dataclass
class SoakReport:
    jobs: int
    outcomes: list
    faults: dict
    restarts: int
    orphans: list
    temp_files: list
    bad_entries: list
    stuck: list
    memory_growth: Optional[float]
    seconds: float

    def count(self, state: str) -> int:
        return sum(o.state == state for o in self.outcomes)

    @property
    def ok(self) -> bool:
        growth_ok = self.memory_growth is None or self.memory_growth <= 0.10
        return (self.count("lost") == 0 and not self.stuck and not self.orphans and not self.temp_files
                and not self.bad_entries and len(self.outcomes) == self.jobs and growth_ok)

    def table(self) -> str:
        growth = "-" if self.memory_growth is None else f"{100 * self.memory_growth:+.1f} %"
        rows = [("jobs asked", self.jobs), ("done", self.count("done")),
                ("failed with a reason", self.count("failed")), ("lost (must be 0)", self.count("lost")),
                ("stuck (must be 0)", len(self.stuck)), ("orphan processes (0)", len(self.orphans)),
                ("temporary files left (0)", len(self.temp_files)),
                ("job entries that do not parse (0)", len(self.bad_entries)),
                ("server memory, second half (<= +10 %)", growth),
                ("faults sent", ", ".join(f"{k} {v}" for k, v in self.faults.items()) or "none"),
                ("server restarts (kill -9)", self.restarts), ("seconds", f"{self.seconds:.0f}")]
        w = max(len(r[0]) for r in rows)
        out = [f"{'':<{w}}  soak"] + [f"{k:<{w}}  {v}" for k, v in rows]
        reasons = sorted({o.reason.split(": ", 1)[-1][:90] for o in self.outcomes if o.state == "failed"})
        if reasons:
            out += ["", "failure reasons:"] + [f"  {r}" for r in reasons]
        return "\n".join(out)


def run_soak(jobs: int = 200, clients: int = 4, restarts: int = 3, workers: int = 2, seed: int = 0,
             faults_per_job: float = 0.3, work: Optional[Path] = None,
             deadline_s: float = 3600.0) -> SoakReport:
    """faults_per_job: how many worker faults the run sends per job (at least 3), each when a
    random share of the jobs has started, like the server restarts: paced by the jobs and not
    by the clock, so that faster jobs meet as many faults as slow ones."""
    rng = random.Random(seed)
    work = Path(work or tempfile.mkdtemp(prefix="kiln-soak-"))
    (work / "photos").mkdir(parents=True, exist_ok=True)
    server = Server(work, workers)
    server.start()
    t0 = time.monotonic()
    deadline = t0 + deadline_s
    lock = threading.Lock()
    next_index = [0]
    outcomes: list[Outcome] = []
    stop = threading.Event()

    def client_loop(ci: int) -> None:
        c = Client(ci, server, work / "photos", deadline)
        while True:
            with lock:
                i = next_index[0]
                if i >= jobs:
                    return
                next_index[0] += 1
            o = c.run(i)
            with lock:
                outcomes.append(o)

    faults = {k: 0 for k in FAULTS}
    restart_at = sorted(rng.uniform(0.15, 0.7) for _ in range(restarts))
    # before the last jobs start, so that each lands while some run
    fault_at = sorted(rng.uniform(0.05, 0.85) for _ in range(max(3, round(jobs * faults_per_job))))
    done_restarts = [0]
    sent = [0]

    def injector() -> None:
        last_sample = 0.0
        while not stop.is_set():
            stop.wait(0.1)
            if stop.is_set():
                return
            if time.monotonic() - last_sample >= 2.0:
                server.sample_memory()
                last_sample = time.monotonic()
            with lock:
                progress = next_index[0] / jobs   # jobs started: a restart lands while some run
            if done_restarts[0] < len(restart_at) and progress >= restart_at[done_restarts[0]]:
                server.worker_pids()
                server.kill()
                done_restarts[0] += 1
                server.start()
                continue
            if sent[0] >= len(fault_at) or progress < fault_at[sent[0]]:
                continue
            pids = server.worker_pids()      # none while a worker restarts: sent at a later turn
            if pids:
                kind = rng.choice(FAULTS)
                try:
                    os.kill(rng.choice(pids), getattr(signal, kind))
                    faults[kind] += 1
                    sent[0] += 1
                except ProcessLookupError:
                    pass

    threads = [threading.Thread(target=client_loop, args=(i,), daemon=True) for i in range(clients)]
    inj = threading.Thread(target=injector, daemon=True)
    for t in threads:
        t.start()
    inj.start()
    for t in threads:
        t.join(max(1.0, deadline - time.monotonic()))
    stop.set()
    inj.join(60)
    server.worker_pids()
    rss = list(server.rss)
    server.stop()
    # orphaned workers notice their parent is gone within a heartbeat or two: wait for that
    # event, with a deadline for a loaded machine, rather than guess how long it takes
    gone_by = time.monotonic() + 30.0
    while any(_alive(p) for p in server.seen_workers) and time.monotonic() < gone_by:
        time.sleep(0.1)
    return SoakReport(
        jobs=jobs, outcomes=sorted(outcomes, key=lambda o: o.index), faults=faults,
        restarts=done_restarts[0], orphans=[p for p in server.seen_workers if _alive(p)],
        temp_files=_temp_files(work / "var"), bad_entries=_bad_entries(work / "var" / "jobs"),
        stuck=_unfinished(work / "var" / "jobs"), memory_growth=_growth(rss), seconds=time.monotonic() - t0)


def _temp_files(var: Path) -> list[str]:
    return [str(p) for p in var.rglob("*.tmp") if p.is_file()]


def _bad_entries(jobs: Path) -> list[str]:
    bad = []
    for d in (p for p in jobs.glob("*/*") if p.is_dir()):
        try:
            json.loads((d / "status.json").read_text())
        except (OSError, ValueError):
            bad.append(str(d))
    return bad


def _unfinished(jobs: Path) -> list[str]:
    out = []
    for f in jobs.glob("*/*/status.json"):
        try:
            if json.loads(f.read_text()).get("state") in ("queued", "running"):
                out.append(f.parent.name)
        except (OSError, ValueError):
            pass
    return out


def _growth(rss: list) -> Optional[float]:
    """Growth of the last server's memory over the second half of its samples, None with too
    few to tell."""
    if len(rss) < 6:
        return None
    half = rss[len(rss) // 2:]
    first, last = half[0][1], max(mb for _, mb in half[-3:])
    return (last - first) / first if first else None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=200)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--restarts", type=int, default=3, help="kill -9 and restart the server this many times")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--faults-per-job", type=float, default=0.3,
                   help="worker faults sent per job, paced by the jobs started (default 0.3, at least 3)")
    p.add_argument("--work", type=Path, help="folder for the server's var/ and logs (default: a temp folder)")
    args = p.parse_args(argv)
    report = run_soak(args.jobs, args.clients, args.restarts, args.workers, args.seed,
                      faults_per_job=args.faults_per_job, work=args.work)
    print(report.table())
    return 0 if report.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
