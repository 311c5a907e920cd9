"""The worker pool, in the app (or CLI) process: the supervisor, its dispatcher thread, the
worker slots, the retry policy, liveness of busy workers and what a restarted server resumes."""
