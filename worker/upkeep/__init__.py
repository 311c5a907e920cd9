"""Keeping a long-running server in shape: disk budgets (``budget``, run by ``housekeeper``),
metrics and the job event log (``telemetry``), the health answer (``health``)."""
