"""Checks of the machine and the backends: ``kiln doctor``, the start-up probes run in a
subprocess, ``kiln selftest`` (GPU backends against their CPU twins)."""
