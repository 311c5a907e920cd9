"""The spawned worker process and what it needs: its config, environment (CUDA paths), start-up
probes, a second interpreter, fault injection for tests, and the in-process twin for debugging."""
