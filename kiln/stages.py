"""The pipeline's stages, by name and in order, with each one's rough share of a job's time.

Pure data, no imports: the supervisor turns a stage's progress into one number for the
whole job without importing ``pipeline/`` (or torch), and the pipeline, the benchmarks and
the progress display all name the same stages.
"""

from __future__ import annotations

# Every stage, in the order a job with baking runs them.
STAGES = ("reconstruct", "render_views", "mesh", "uv", "bake", "export")
# Without baking there are no views to render and no texture to unwrap for.
UNBAKED_STAGES = ("reconstruct", "mesh", "export")
# Rough share of a job's time per stage (sums to 1 over STAGES).
WEIGHTS = {"reconstruct": 0.30, "render_views": 0.15, "mesh": 0.05, "uv": 0.15,
           "bake": 0.30, "export": 0.05}


def stages_for(bake_enabled: bool) -> tuple[str, ...]:
    """The stages a job runs, in order."""
    return STAGES if bake_enabled else UNBAKED_STAGES
