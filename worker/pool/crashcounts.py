"""How often each input has crashed a worker, kept on disk across server restarts, so an
input that keeps killing workers is not retried again and again (``worker.pool.retry``)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from worker.jobs.jobstore import atomic_write_json

log = logging.getLogger("kiln.worker")


class CrashCounts:
    """input digest (``kiln.digest.input_digest``) -> crashes, in one JSON file."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._counts: dict[str, int] = {}

    def load(self) -> None:
        """Read the file; a missing or damaged one counts as no crashes yet."""
        try:
            data = json.loads(self.path.read_text())
            self._counts = {str(k): int(v) for k, v in data.items()}
        except (OSError, ValueError, AttributeError):
            self._counts = {}

    def add(self, digest: str) -> int:
        """Count one more crash for ``digest`` and save; returns its count so far."""
        count = self._counts[digest] = self._counts.get(digest, 0) + 1
        try:
            atomic_write_json(self.path, self._counts)
        except OSError as e:   # the count still holds for this server's lifetime
            log.warning("cannot record crash counts: %s", e)
        return count
