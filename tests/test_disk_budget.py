"""Disk budgets, metrics, the JSON job log and the health answer (issue 37), in process: a real
job store and cache on disk, the dispatcher's records without workers, the clock passed in."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kiln.settings import load
from worker.jobs.jobstore import DONE, FAILED, QUEUED, RUNNING, JobStore
from worker.pool.dispatcher import Dispatcher
from worker.pool.jobrecord import JobRecord
from worker.upkeep import health as health_mod
from worker.upkeep.budget import DAY_S, MB, Budgets, CacheEntry, plan_cache, prune
from worker.upkeep.housekeeper import Housekeeper
from worker.upkeep.telemetry import Telemetry

KB = 1 << 10
NOW = 2_000_000_000.0   # the test's clock: statuses and passes use it, never time.time()


def _photo():
    rgb = np.zeros((128, 128, 3), np.uint8)
    mask = np.zeros((128, 128), bool)
    mask[32:96, 32:96] = True
    return rgb, mask


def _job(store: JobStore, state: str, ended: float | None, out_kb: int, session: str = "web-b-t"):
    """A job in ``state`` that ended at ``ended`` with an output of ``out_kb`` KiB."""
    st = store.create(*_photo(), load(), session)
    d = store.job_dir(st.id)
    (d / "outputs" / "model.glb").write_bytes(b"\0" * (out_kb * KB))
    st.state, st.created = state, (ended or NOW) - 60
    st.started = st.created + 1 if state != QUEUED else None
    st.finished = ended if state in (DONE, FAILED) else None
    st.outputs = {"glb": str(d / "outputs" / "model.glb")} if state == DONE else {}
    store.write_status(st)
    return st


@pytest.fixture
def house(tmp_path):
    store = JobStore(tmp_path / "jobs")
    cache = tmp_path / "cache"
    cache.mkdir()
    d = Dispatcher(load(), store, cache, tmp_path, None, 0.02, engine=None)  # type: ignore[arg-type]
    tel = Telemetry(tmp_path / "logs" / "jobs.jsonl")
    d.events_out = tel
    hk = Housekeeper(d, store, cache, Budgets(cache_bytes=1 * MB, jobs_bytes=1 * MB, keep_jobs_s=7 * DAY_S),
                     tel, clock=lambda: NOW)
    yield hk
    tel.close()


def _records(hk: Housekeeper) -> None:
    for st in hk.store.scan():
        hk.dispatcher.jobs[st.id] = JobRecord(status=st, dir=hk.store.job_dir(st.id))


def test_the_store_past_its_budget_loses_its_oldest_ended_jobs_not_running_or_shown_ones(house):
    store = house.store
    running = _job(store, RUNNING, None, 300)                  # the oldest of all, and running
    queued = _job(store, QUEUED, None, 300)
    ended = [_job(store, DONE if i % 2 else FAILED, NOW - 3600 * (10 - i), 300) for i in range(6)]
    shown = ended[0]                                             # the oldest ended: a page shows it
    _records(house)
    house.protected = lambda: {shown.id}
    report = house.run_once()
    gone = [r.id for r in report.jobs]
    # 8 x 300 KiB over 1 MiB: the oldest ended ones go until it fits; the shown one stays
    assert gone == [e.id for e in ended[1:6]][:len(gone)] and len(gone) >= 4
    assert report.jobs_bytes <= 1 * MB + 2 * 300 * KB          # running + queued may keep it over
    for keep in (running, queued, shown, *[e for e in ended if e.id not in gone]):
        assert (store.job_dir(keep.id) / "outputs" / "model.glb").is_file()
        assert store.read_status(keep.id).removed is None
    for job_id in gone:
        d = store.job_dir(job_id)
        assert sorted(p.name for p in d.iterdir()) == ["status.json"]
        st = store.read_status(job_id)
        assert st.removed == NOW and "app.jobs_max_mb (1 MB)" in st.removed_why
        rec = house.dispatcher.jobs[job_id].status               # what a page reads says so too
        assert (rec.removed, rec.removed_why) == (st.removed, st.removed_why)


def test_age_removes_ended_jobs_then_forgets_their_stubs(house):
    store = house.store
    old = _job(store, DONE, NOW - 8 * DAY_S, 1)
    young = _job(store, DONE, NOW - 1 * DAY_S, 1)
    running = _job(store, RUNNING, None, 1)
    _records(house)
    assert [r.id for r in house.run_once().jobs] == [old.id]
    assert "older than app.keep_jobs_days (7 days)" in store.read_status(old.id).removed_why
    later = NOW + 8 * DAY_S                                      # a week and a day on
    report = house.run_once(now=later)
    assert [(r.id, r.forget) for r in report.jobs] == [(young.id, False), (old.id, True)]
    assert old.id not in house.dispatcher.jobs and not (store.root / old.session / old.id).exists()
    assert running.id in house.dispatcher.jobs and store.read_status(running.id).removed is None


def test_dry_run_removes_nothing(house):
    a = _job(house.store, DONE, NOW - 10 * DAY_S, 1)
    _records(house)
    report = house.run_once(dry_run=True)
    assert [r.id for r in report.jobs] == [a.id]
    assert house.store.read_status(a.id).removed is None and house.dispatcher.jobs[a.id].status.removed is None


def test_the_cache_past_its_budget_loses_its_least_recently_used_entries_not_those_in_use(house):
    cache = house.cache_dir
    t0 = time.time() - 1000
    paths = []
    for i in range(6):
        p = cache / f"recon-{i:064x}.npz"
        p.write_bytes(b"\0" * (300 * KB))
        os.utime(p, (t0 + i * 100, t0 + i * 100))
        paths.append(p)
    os.utime(paths[0], (t0 + 900, t0 + 900))          # the first written, served last: recently used
    # a running job started after entry 1 was last used: entries used since (2..5, 0) may be its
    run = _job(house.store, RUNNING, None, 1)
    run.started = t0 + 150
    house.store.write_status(run)
    _records(house)
    report = house.run_once()
    assert [e.path for e in report.cache] == [paths[1]]       # over budget still: the rest are in use
    assert not paths[1].exists() and all(p.exists() for p in paths if p != paths[1])
    # the job ended: least recently used first, down to the budget
    assert [e.path.name for e in plan_cache([CacheEntry(p, 300 * KB, p.stat().st_mtime) for p in paths if p.exists()],
                                            1 * MB, None)] == [paths[i].name for i in (2, 3)]


def test_metrics_parse_and_count_jobs_stages_restarts_and_disk(house, tmp_path):
    tel: Telemetry = house.events   # type: ignore[assignment]
    tel.bind(lambda: 3, lambda: 1, lambda: 2)
    st = _job(house.store, RUNNING, None, 1)
    clock = iter([0.0, 1.5, 4.0, 4.5, 5.0])
    tel.clock = lambda: next(clock)
    tel.started(st, 1, 0)
    st.stage = "reconstruct"
    tel.stage(st, None)
    st.stage = "export"
    tel.stage(st, "reconstruct")
    st.state, st.finished = DONE, st.created + 5
    tel.ended(st)
    tel.worker_restarted("crash")
    tel.worker_restarted("hang")
    _records(house)
    house.run_once()
    fams = {f.name: f for f in text_string_to_metric_families(tel.render().decode())}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in fams.values() for s in f.samples}
    assert samples[("kiln_jobs_total", (("kind", "image"), ("outcome", "done")))] == 1
    assert samples[("kiln_queue_length", ())] == 3
    assert samples[("kiln_workers_ready", ())] == 2
    assert samples[("kiln_stage_seconds_count", (("kind", "image"), ("stage", "reconstruct")))] == 1
    assert samples[("kiln_stage_seconds_sum", (("kind", "image"), ("stage", "reconstruct")))] == 2.5
    assert samples[("kiln_stage_seconds_sum", (("kind", "image"), ("stage", "export")))] == 0.5
    assert samples[("kiln_worker_restarts_total", (("cause", "crash"),))] == 1
    assert samples[("kiln_disk_budget_bytes", (("area", "jobs"),))] == 1 * MB
    assert samples[("kiln_disk_bytes", (("area", "jobs"),))] > 0
    assert fams["kiln_stage_seconds"].type == "histogram"


def test_job_log_lines_are_json_with_a_hashed_session(house, tmp_path):
    tel: Telemetry = house.events   # type: ignore[assignment]
    st = _job(house.store, RUNNING, None, 1, session="web-SECRETBROWSER-tab1")
    tel.queued(st)
    tel.started(st, 1, 0)
    st.stage = "mesh"
    tel.stage(st, None)
    st.state, st.error, st.finished = FAILED, "worker crashed with SIGSEGV during stage 'mesh'", st.created + 2
    tel.ended(st)
    text = (tmp_path / "logs" / "jobs.jsonl").read_text()
    assert "SECRETBROWSER" not in text
    lines = [json.loads(line) for line in text.splitlines()]
    assert [ln["event"] for ln in lines] == ["queued", "started", "stage", "ended"]
    end = lines[-1]
    assert (end["job"], end["kind"], end["stage"], end["outcome"]) == (st.id, "image", "mesh", "failed")
    assert end["reason"].startswith("worker crashed") and end["duration_s"] == 2.0
    assert lines[2]["outcome"] == "failed" and lines[2]["stage"] == "mesh"
    assert len({ln["session"] for ln in lines}) == 1 and len(lines[0]["session"]) == 16


def test_health_is_503_when_the_disk_is_full_or_no_worker_can_start(monkeypatch, tmp_path):
    ready = [{"state": "idle", "broken": None}]
    monkeypatch.setattr(health_mod, "disk_free", lambda p: 10 * 1024 * MB)
    h = health_mod.judge(ready, [tmp_path], 100 * MB)
    assert h.ok and h.to_dict()["status"] == "ok"
    monkeypatch.setattr(health_mod, "disk_free", lambda p: 5 * MB)
    h = health_mod.judge(ready, [tmp_path], 100 * MB)
    assert not h.ok and "no room for a job" in h.reasons[0] and "5 MB free" in h.reasons[0]
    monkeypatch.setattr(health_mod, "disk_free", lambda p: 10 * 1024 * MB)
    broken = [{"state": "starting", "broken": "worker 0 failed to start 3 times: could not be spawned"}]
    h = health_mod.judge(broken, [tmp_path], 100 * MB)
    assert not h.ok and h.reasons[0].startswith("no worker could start: worker 0 failed to start 3 times")


def test_a_supervisor_whose_workers_cannot_start_is_unhealthy(tmp_path):
    """The real supervisor: every spawn fails at once (its slot already at its last chance)."""
    from worker.engines.local import LocalEngine
    from worker.errors import WorkerStartError
    from worker.pool.slots import STARTUP_FAILURES_LIMIT
    from worker.pool.supervisor import Supervisor

    class NoWorkers(LocalEngine):
        def slots(self, var_dir):
            out = super().slots(var_dir)
            for s in out:
                s.failures = STARTUP_FAILURES_LIMIT - 1
            return out

        def spawn(self, slot, cfg):
            raise OSError("no processes left")

    settings = load(overrides={"worker.device": "cpu", "app.job_log": "off"})
    sup = Supervisor(settings, tmp_path / "jobs", tmp_path / "cache", engine=NoWorkers(settings))
    with pytest.raises(WorkerStartError):
        sup.start()
    h = sup.health()
    assert not h.ok and "no worker could start" in h.reasons[0] and "no processes left" in h.reasons[0]


# --------------------------------------------------------------------------- the web side

def _call(mw, path: str, client: str, headers=()):
    """One request through an ASGI app, in process: (status, body)."""
    import asyncio

    sent = []

    async def receive():
        return {"type": "http.request", "body": b""}

    async def send(msg):
        sent.append(msg)

    scope = {"type": "http", "method": "GET", "path": path, "client": (client, 5000),
             "headers": [(k.encode(), v.encode()) for k, v in headers]}
    asyncio.run(mw(scope, receive, send))
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


def test_healthz_and_metrics_answer_loopback_and_configured_networks_only():
    from app.web.server.ops import OpsRoutes
    from app.web.server.proxies import TrustedProxies

    async def gradio(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"page"})

    state = {"code": 200}
    mw = OpsRoutes(gradio, health=lambda: (state["code"], {"status": "x"}),
                   metrics=lambda: (200, b"kiln_queue_length 0\n"), networks=["10.1.0.0/16"],
                   proxies=TrustedProxies(["127.0.0.1"]))
    assert _call(mw, "/healthz", "127.0.0.1") == (200, b'{"status": "x"}')
    state["code"] = 503
    assert _call(mw, "/healthz", "::1")[0] == 503
    assert _call(mw, "/metrics", "10.1.2.3") == (200, b"kiln_queue_length 0\n")
    assert _call(mw, "/metrics", "192.168.1.9")[0] == 404
    # a reverse proxy on this machine forwarding the world does not make the world loopback
    assert _call(mw, "/metrics", "127.0.0.1", [("x-forwarded-for", "203.0.113.7")])[0] == 404
    assert _call(mw, "/", "192.168.1.9") == (200, b"page")


def test_a_history_entry_of_a_removed_job_says_when_and_why_and_offers_no_download(tmp_path):
    from app.web.server.results import ResultPublisher
    from app.web.state.history import history_files, history_html

    store = JobStore(tmp_path / "jobs")
    kept = _job(store, DONE, NOW - 60, 1, session="web-b1-t1")
    gone = _job(store, DONE, NOW - 120, 1, session="web-b1-t1")
    hk_store_status = store.read_status(gone.id)
    from worker.upkeep.budget import remove_job_files

    removed = remove_job_files(store.job_dir(gone.id), hk_store_status, NOW,
                               "older than app.keep_jobs_days (14 days)")
    statuses = [store.read_status(kept.id), removed]
    text = history_html(statuses)
    day = time.strftime("%Y-%m-%d %H:%M", time.localtime(NOW))
    assert f"done; its files were removed on {day}: older than app.keep_jobs_days (14 days)" in text
    assert text.count(".glb</code>") == 1 and "kiln-removed" in text
    files = history_files("web-b1-t1", statuses, ResultPublisher(tmp_path / "results"))
    assert len(files) == 1


def test_a_real_job_counts_in_the_metrics_and_the_log_and_health_is_ok(tmp_path):
    """The dispatcher's hooks, end to end: one small job on a real worker."""
    from worker.pool.supervisor import Supervisor
    from worker_helpers import image, small_settings

    settings = small_settings(**{"worker__count": 1, "worker__device": "cpu", "bake__enabled": False})
    with Supervisor(settings, tmp_path / "jobs", tmp_path / "cache") as sup:
        st = sup.run(*image(), settings, session="web-abc-tab")
        assert st.state == DONE
        assert sup.health().ok
        fams = {f.name: f for f in text_string_to_metric_families(sup.telemetry.render().decode())}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in fams.values() for s in f.samples}
    assert samples[("kiln_jobs_total", (("kind", "image"), ("outcome", "done")))] == 1
    stages = {dict(k[1])["stage"] for k in samples if k[0] == "kiln_stage_seconds_count"}
    assert {"reconstruct", "export"} <= stages
    lines = [json.loads(ln) for ln in (tmp_path / "logs" / "jobs.jsonl").read_text().splitlines()]
    assert lines[0]["event"] == "queued" and lines[-1]["event"] == "ended" and lines[-1]["outcome"] == "done"
    assert all(ln["job"] == st.id for ln in lines)


def test_a_job_seen_running_is_measured_again_once_it_ended(house):
    """Its outputs come at the end: the size a pass saw while it ran must not stick."""
    st = _job(house.store, RUNNING, None, 1)
    _records(house)
    assert house.run_once().jobs == []
    rec = house.dispatcher.jobs[st.id].status
    (house.store.job_dir(st.id) / "outputs" / "model.glb").write_bytes(b"\0" * (2 * MB))
    rec.state, rec.finished = DONE, NOW - 60
    report = house.run_once()
    assert [r.id for r in report.jobs] == [st.id] and report.jobs[0].bytes > 2 * MB


def test_kiln_jobs_lists_shows_and_prunes_by_the_same_rules(tmp_path, capsys):
    """``kiln jobs``: list gives every job with its state and size and the disk against the
    budgets; show one job's status and files; prune --dry-run says what would go and removes
    nothing, prune removes ended jobs past the age limit and never a running one."""
    import time as clock

    from app.cli.cli import main

    store = JobStore(tmp_path / "var" / "jobs")
    now = clock.time()
    old = _job(store, DONE, now - 20 * DAY_S, 64)
    recent = _job(store, DONE, now - 60, 64)
    running = _job(store, RUNNING, None, 64)
    running.created = running.started = now - 30 * DAY_S   # started long ago, still running
    store.write_status(running)
    where = ["--set", f"app.jobs_dir={tmp_path / 'var' / 'jobs'}", "--set", f"app.cache_dir={tmp_path / 'var' / 'cache'}"]

    assert main(["jobs", "list", *where]) == 0
    out = capsys.readouterr().out
    assert all(j.id in out for j in (old, recent, running)) and "3 jobs; job store" in out and "app.jobs_max_mb" in out
    assert main(["jobs", "show", old.id, *where]) == 0
    out = capsys.readouterr().out
    assert '"state": "done"' in out and "outputs/model.glb" in out
    assert main(["jobs", "show", "no-such-job", *where]) != 0
    assert "no such job" in capsys.readouterr().err

    assert main(["jobs", "prune", "--older-than", "7", "--dry-run", *where]) == 0
    out = capsys.readouterr().out
    assert f"would remove the files of job {old.id}" in out and recent.id not in out and running.id not in out
    assert (store.job_dir(old.id) / "outputs" / "model.glb").exists()
    assert main(["jobs", "prune", "--older-than", "7", *where]) == 0
    assert f"removed the files of job {old.id}" in capsys.readouterr().out
    assert not (store.job_dir(old.id) / "outputs" / "model.glb").exists()
    assert (store.job_dir(recent.id) / "outputs" / "model.glb").exists()
    assert (store.job_dir(running.id) / "outputs" / "model.glb").exists()
    assert main(["jobs", "prune", "--older-than", "-1", *where]) != 0
    assert "--older-than: a number of days" in capsys.readouterr().err


def test_published_copies_of_removed_jobs_go_with_them_and_old_ones_age_out(house, tmp_path):
    """Issue 37: the page's copies of results (``ResultPublisher``, under Gradio's folder) are
    counted with the job store but were never removed while the server ran: Gradio's own
    clean-up only sees what passed through a component, not the history's download links.
    The housekeeper's pass now removes a removed job's copies; a kept job's stay, and a copy a
    page was given lately stays even when its job went. Older than a day, any copy not on
    show goes (it is made again when a page asks)."""
    from app.web.server.results import ResultPublisher

    store = house.store
    pub = ResultPublisher(tmp_path / "gradio" / "results")
    jobs = [_job(store, DONE, NOW - 3600 * (10 - i), 400, session="web-b1-t1") for i in range(4)]
    copies = {st.id: pub.publish("web-b1-t1", st, f"photo-{i}")["glb"] for i, st in enumerate(jobs)}
    pub._shown.clear()   # none on show: published long ago
    pub.publish("web-b1-t1", jobs[0], "photo-0")   # ... except the oldest, on show now
    _records(house)
    house.protected = lambda: pub.shown_within(600)   # as the app wires it (AppContext.on_show)
    house.after_pass.append(pub.trim)   # as the app does; file times are the real clock's
    report = house.run_once()
    gone = {r.id for r in report.jobs}
    assert gone and jobs[0].id not in gone   # 4 x 400 KiB over 1 MiB; the shown one is protected
    for st in jobs:
        assert copies[st.id].is_file() == (st.id not in gone), st.id
    # a day later (file times are the real clock's): every copy not on show goes
    assert pub.trim({st.id for st in jobs}, age_s=86400, now=time.time() + 2 * 86400) == \
        len([st for st in jobs if st.id not in gone]) - 1
    assert copies[jobs[0].id].is_file()
    # a page asking again gets its copy back
    again = pub.publish("web-b1-t1", store.read_status(jobs[-1].id), "photo-3")
    assert again.get("glb") is None or again["glb"].is_file()
