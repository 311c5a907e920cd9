"""Gradio's queue for Generate is the job queue: Generate events of every tab share the
concurrency group ``GPU_GROUP``, whose limit is the number of workers, so the supervisor
never gets more jobs from the page than it has workers and a waiting person sees their
place in Gradio's queue. Upload and click events run in groups of their own, so people
can segment while jobs run."""

from __future__ import annotations

import gradio as gr

GPU_GROUP = "gpu"


def gpu_queue_counts(demo: gr.Blocks) -> tuple[int, int]:
    """(running, waiting) Generate events in Gradio's "gpu" concurrency group.

    Reads Gradio's queue internals (stable through gradio 6.x, pinned <7);
    answers (0, 0) if they ever change rather than breaking the page.
    """
    try:
        q = demo._queue.event_queue_per_concurrency_id.get(GPU_GROUP)
        return (int(q.current_concurrency), len(q.queue)) if q is not None else (0, 0)
    except AttributeError:
        return 0, 0
