"""A job's time estimate comes from its own settings (issue 38, "Estimates"): a cost model
fitted on the stage timings of the jobs done here, not one median over every job."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

from kiln.records import JobStats, PipelineStats
from kiln.settings import Settings
from worker.jobs.jobstore import JobStatus

from app.web.state import browser_jobs
from app.web.state.estimates import CostModel, JobShape, sample_of, shape_of

# what a default job (1024 px, opt, 16 views of 512 px) reported on the 2-core machine
# (docs/benchmarks.md's stages, rounded): 11.5 s of stages, 0.8 s outside them
DEFAULT_TIMINGS = {"reconstruct": 1.0, "render_views": 3.8, "mesh": 0.5, "uv": 0.4, "bake": 4.8,
                   "export": 1.0, "queued_s": 0.5, "total_s": 12.8}


def _settings(**over) -> dict:
    """Settings.to_dict() with ``section.key`` values replaced (as a job's settings.json)."""
    d = Settings().to_dict()
    for key, value in over.items():
        section, name = key.split(".")
        d[section][name] = value
    return d


SMALL = dict(**{"bake.texture_size": 512, "bake.mode": "fast", "views.count": 8})
LARGE = dict(**{"bake.texture_size": 2048, "bake.mode": "opt", "views.count": 32})


def test_the_model_scales_each_stage_by_what_it_grows_with():
    model = CostModel.fit([sample_of(shape_of(_settings()), DEFAULT_TIMINGS)])
    assert model is not None
    default = model.estimate(shape_of(_settings()))
    assert abs(default - 12.3) < 1e-6     # its own job back: the run less the queue
    small, large = model.estimate(shape_of(_settings(**SMALL))), model.estimate(shape_of(_settings(**LARGE)))
    # the jobs: 512/fast/8 ran 5.8 s (was told 29 s), 2048/opt/32 far longer than a default
    assert small < 0.6 * default and large > 2 * default
    # each setting alone moves the estimate its own way
    for over in ({"views.count": 32}, {"bake.texture_size": 2048}, {"views.resolution": 1024}):
        assert model.estimate(shape_of(_settings(**over))) > default
    assert model.estimate(shape_of(_settings(**{"bake.mode": "fast"}))) < default
    assert model.estimate(shape_of(_settings(**{"bake.enabled": False}))) < default
    assert model.estimate(shape_of(_settings(**{"mesh.faces": 100000}))) > default
    # a texture size "auto" counts as the size it picked, once known
    auto = _settings(**{"bake.texture_size": "auto"})
    assert shape_of(auto).texture == 1024 and shape_of(auto, texture_picked=2048).texture == 2048


def test_a_cached_stage_does_not_teach_its_rate():
    """A job that reused its reconstruction spent ~0 s there: its 0 is not the stage's rate."""
    shape = shape_of(_settings())
    cached = dict(DEFAULT_TIMINGS, reconstruct=0.01, total_s=11.8)
    model = CostModel.fit([sample_of(shape, DEFAULT_TIMINGS), sample_of(shape, cached, reconstruction_cached=True)])
    assert model is not None and abs(model.rates["reconstruct"] * shape.units()["reconstruct"] - 1.0) < 1e-9
    assert CostModel.fit([]) is None and sample_of(shape, {"bake": 1.0}) is None   # no total: not done


def test_a_stage_the_model_has_no_unit_for_costs_its_median():
    shape = JobShape(kind="bake")
    model = CostModel.fit([sample_of(shape, {"read": 2.0, "fit": 6.0, "total_s": 8.0}),
                           sample_of(shape, {"read": 4.0, "fit": 6.0, "total_s": 10.0})])
    assert model is not None and model.estimate(shape) == 9.0


def _ctx(tmp_path: Path, done: list[tuple[dict, dict]], running: list[tuple[str, dict]]):
    """A page context whose pool holds ``done`` (settings, timings) jobs and ``running`` ones."""
    dirs, statuses = {}, []
    for i, (settings, timings) in enumerate(done):
        statuses.append(JobStatus(id=f"d{i}", session="s", state="done", timings=dict(timings),
                                  stats=JobStats(pipeline=PipelineStats())))
    for job_id, _ in running:
        statuses.append(JobStatus(id=job_id, session="s", state="running", stage="bake", progress=0.45,
                                  started=time.time() - 3.0))
    for st, settings in zip(statuses, [s for s, _ in done] + [s for _, s in running]):
        dirs[st.id] = tmp_path / st.id
        dirs[st.id].mkdir()
        (dirs[st.id] / "settings.json").write_text(json.dumps(settings))
    sup = SimpleNamespace(jobs=lambda: statuses, job=lambda j: SimpleNamespace(id=j, dir=dirs[j]),
                          running=lambda: [s for s in statuses if s.state == "running"],
                          queue_place=lambda j: None)
    ctx = SimpleNamespace(sup=sup, workers=1, typical_job_s={}, cost_models={}, job_shapes={})
    return ctx, {st.id: st for st in statuses}


def test_a_job_is_told_what_its_own_settings_take(tmp_path):
    """The page's figure for two jobs running after default ones: the small one hears less
    than a default took, the large one more; the old median told both the same."""
    ctx, st = _ctx(tmp_path, [(_settings(), DEFAULT_TIMINGS)] * 3,
                   [("small", _settings(**SMALL)), ("large", _settings(**LARGE))])
    median = browser_jobs.typical_job_seconds(ctx, "image")
    small, large = browser_jobs.job_estimate_s(ctx, st["small"]), browser_jobs.job_estimate_s(ctx, st["large"])
    assert small is not None and large is not None and median is not None
    assert small < median < large and large > 3 * small
    # the bar says it: "Baking texture — 45% — 3 s so far, about N s left" with each job's own N
    bars = [browser_jobs.progress_view(ctx, st[j]) for j in ("small", "large")]
    lefts = [int(b.split("about ")[1].split(" s left")[0]) for b in bars]
    assert lefts[0] < lefts[1] and all("s left" in b for b in bars)
    # a running job's left time for the queue comes from its own settings too
    left = browser_jobs.running_left_s(ctx, 10.0, time.time())
    assert left[0] < left[1]


def test_without_settings_or_stage_timings_the_kinds_median_answers(tmp_path):
    ctx, st = _ctx(tmp_path, [(_settings(), {"queued_s": 0.5, "total_s": 10.5})], [("j", _settings())])
    # a done job without stage timings (an old report): its other time alone is the model
    assert browser_jobs.job_estimate_s(ctx, st["j"]) == 10.0
    (tmp_path / "j" / "settings.json").unlink()
    ctx.job_shapes.clear()
    assert browser_jobs.job_estimate_s(ctx, st["j"]) == browser_jobs.typical_job_seconds(ctx, "image") == 10.0
