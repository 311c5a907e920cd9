"""How long a job will take, from its own settings: a cost model fitted on the stage timings
the jobs done here reported.

Why not one median over every job: a 512 px / fast / 8-view job and a 2048 px / opt / 32-view
job differ tenfold, and a median of either kind told the other a figure off by that much
("about 29 s left" for a job done in 5.8 s; "about 2 s left" at 45 % of a long one).

The model: each stage costs ``rate x units``, where the units say what the stage's work grows
with under the job's settings (views x view pixels for ``render_views``, texture texels and the
views for ``bake``, ...) and the rate (seconds per unit) is the median over recent done jobs
of that stage's seconds over its units. A job's estimate is the sum over its stages plus the
median time a job spent outside its stages (a worker starting, reading the inputs). The rates
are of this machine and this load, so the figure follows them; the units only carry the
settings' share, which is why a crude unit is enough.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median
from typing import Any, Iterable, Mapping, Optional

# the texture size a job of ``bake.texture_size: auto`` is taken to bake before it ran
# (the default size; a done job reports the one it picked)
AUTO_TEXTURE = 1024
# opt mode against fast at the same settings: docs/benchmarks.md measured 4.79 s against
# 2.17 s at 120 steps (2.2x); each step renders the views again, so it grows with the steps
OPT_PER_STEP = 1.0 / 100.0


@dataclass(frozen=True)
class JobShape:
    """What a job's run time grows with, read from its settings (``shape_of``).

    kind: "image" | "bake" | "fit". views: bake views; view_px: their width (and height);
    texture: texture width in texels (0: no bake); mode: "fast" | "opt"; steps: opt's steps;
    grid: the reconstruction's cells across the object; faces: the mesh's target faces
    (``mesh.faces``, else the share simplification keeps of ``grid``^2).
    """

    kind: str = "image"
    views: int = 16
    view_px: int = 512
    texture: int = AUTO_TEXTURE
    mode: str = "opt"
    steps: int = 120
    grid: int = 160
    faces: float = 0.0

    def units(self) -> dict[str, float]:
        """stage -> how much work it does for this shape, in the unit its rate is fitted in.
        A stage not named here costs one unit (its median seconds)."""
        view_px2 = float(self.views * self.view_px ** 2)
        tex2 = float(self.texture ** 2)
        mode = 1.0 + self.steps * OPT_PER_STEP if self.mode == "opt" else 1.0
        out = {"render_views": view_px2,
               "bake": (view_px2 + tex2) * mode if self.texture else 0.0,
               "export": tex2 + self.faces,
               "uv": self.faces}
        if self.kind == "image":
            out["reconstruct"] = out["mesh"] = float(self.grid ** 2)
        return out


def shape_of(settings: Mapping[str, Any], kind: str = "image",
             texture_picked: Optional[int] = None) -> JobShape:
    """The shape of a job from its settings (``kiln.settings.Settings.to_dict()``, as its
    ``settings.json`` keeps them). ``texture_picked``: the size ``auto`` chose, once known."""
    v, b, m, r = (settings.get(k) or {} for k in ("views", "bake", "mesh", "reconstruct"))
    size = b.get("texture_size", AUTO_TEXTURE)
    texture = int(texture_picked or (AUTO_TEXTURE if str(size) == "auto" else size))
    grid = int(r.get("resolution", 160))
    faces = float(m.get("faces") or 0) or (1.0 - float(m.get("simplify_ratio", 0.95))) * grid ** 2
    return JobShape(kind=kind, views=int(v.get("count", 16)), view_px=int(v.get("resolution", 512)),
                    texture=texture if b.get("enabled", True) else 0, mode=str(b.get("mode", "opt")),
                    steps=int(b.get("steps", 120)), grid=grid, faces=faces)


@dataclass(frozen=True)
class Sample:
    """One done job: its shape, its stage seconds (``JobStatus.timings`` less queued/total),
    the seconds outside its stages, and the stages whose result came from the cache (their
    seconds say nothing of their work)."""

    shape: JobShape
    stages: Mapping[str, float]
    other_s: float
    cached: frozenset[str] = frozenset()


@dataclass(frozen=True)
class CostModel:
    """Seconds per unit for each stage seen (``fit``), the median time outside the stages."""

    rates: Mapping[str, float]
    other_s: float

    @staticmethod
    def fit(samples: Iterable[Sample]) -> Optional["CostModel"]:
        """The model of ``samples`` (the recent done jobs of one kind); None without any."""
        samples = list(samples)
        if not samples:
            return None
        per_stage: dict[str, list[float]] = {}
        for s in samples:
            units = s.shape.units()
            for stage, secs in s.stages.items():
                if stage in s.cached:
                    continue
                u = units.get(stage, 1.0)
                if u > 0:
                    per_stage.setdefault(stage, []).append(float(secs) / u)
        return CostModel({k: median(v) for k, v in per_stage.items()},
                         median(max(0.0, s.other_s) for s in samples))

    def estimate(self, shape: JobShape) -> float:
        """Seconds a job of ``shape`` runs (a worker's start of it to its end), queue left out."""
        units = shape.units()
        return self.other_s + sum(rate * units.get(stage, 1.0) for stage, rate in self.rates.items())


def sample_of(shape: JobShape, timings: Mapping[str, float], reconstruction_cached: bool = False,
              views_cached: Optional[bool] = False) -> Optional[Sample]:
    """A ``Sample`` from a done job's ``JobStatus.timings`` (stage seconds plus ``queued_s``
    and ``total_s``); None when it has no total."""
    total = timings.get("total_s")
    if not isinstance(total, (int, float)):
        return None
    stages = {k: float(v) for k, v in timings.items()
              if k not in ("total_s", "queued_s") and isinstance(v, (int, float))}
    run = float(total) - float(timings.get("queued_s") or 0.0)
    cached = frozenset(k for k, c in (("reconstruct", reconstruction_cached),
                                      ("render_views", bool(views_cached))) if c)
    return Sample(shape, stages, run - sum(stages.values()), cached)
