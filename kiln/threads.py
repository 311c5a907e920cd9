"""How torch's CPU threads wait between parallel regions, set before torch is imported.

torch's CPU build runs its parallel ops on GNU OpenMP (libgomp), whose idle threads spin
for a while at the end of every parallel region before they sleep. The CPU stages run
thousands of short ops (the splat renderer alone ~15k a job), so on a machine whose cores
are busy with other work a spinning thread takes the time slice its partner needs to
finish, and every op waits a scheduler quantum. Measured on the 2-core machine at load
average 9-11 (docs/benchmarks.md): the 16 bake views took 150-160 s wall and 47-54 s CPU
with libgomp's default, 16-22 s and 6.5-6.7 s with ``OMP_WAIT_POLICY=PASSIVE``
(``GOMP_SPINCOUNT=10000``: 37 s, 9.5 s). libgomp reads the variable once, when torch loads
it, so it has to be in the environment before the first ``import torch``.
"""

from __future__ import annotations

from typing import MutableMapping

# the variables through which a person may already have chosen how OpenMP threads wait
# (libgomp's two, and Intel's OpenMP's): any of them set, Kiln leaves the choice alone
WAIT_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")


def passive_openmp(env: MutableMapping[str, str]) -> bool:
    """Put ``OMP_WAIT_POLICY=PASSIVE`` into ``env`` (normally ``os.environ``) unless one of
    ``WAIT_VARS`` is set. Returns whether it was put there."""
    if any(env.get(name) for name in WAIT_VARS):
        return False
    env["OMP_WAIT_POLICY"] = "PASSIVE"
    return True
