"""Where CUDA work runs: ``pool`` (the supervisor and its slots, in the app process), ``child``
(the spawned worker process), ``jobs`` (jobs on disk and their input checks), ``engines``
(local processes or a Ray cluster), ``checks`` (doctor and selftest); ``messages`` is what
the pool and a worker say to each other."""
