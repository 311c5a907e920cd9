"""The cameras a tab has fitted and not yet dropped: the bake tab's "Fit the camera to the
photo" keeps its fit here, under the tab's session (``browser.session_name``: the browser's
cookie and the tab, never a value the client names), until the photo, the mask or the model
changes, another fit replaces it or the tab closes. A Bake of the tab then uses it as it is.

Only what names the fit is kept in memory: the fit job's id, what it was fitted to
(``worker.jobs.bakeinputs.fit_key``), its figures (``kiln.records.CameraFitReport``) and where its
camera file lies (the job's own ``outputs/camera.json``, which the job store keeps).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from kiln.records import CameraFitReport

# fits kept at most (a tab keeps one; the oldest goes first)
MAX_FITS = 1000


@dataclass(frozen=True)
class StoredFit:
    """A tab's fitted camera. job_id: the fit job; key: ``worker.jobs.bakeinputs.fit_key`` of the
    mesh, splat, source, photo and mask it was fitted to; camera: its camera file (the
    fit's report, the form ``kiln bake --camera`` reads); report: its figures; picture: the
    fitted silhouette over the photo as the page shows it (a file of the tab's browser)."""

    job_id: str
    key: str
    camera: Path
    report: CameraFitReport
    picture: Optional[str] = None


class FittedCameras:
    """session -> its ``StoredFit``. Thread-safe."""

    def __init__(self, limit: int = MAX_FITS):
        self._lock = threading.Lock()
        self._fits: OrderedDict[str, StoredFit] = OrderedDict()
        self._limit = limit

    def put(self, session: str, fit: StoredFit) -> None:
        with self._lock:
            self._fits.pop(session, None)
            self._fits[session] = fit
            while len(self._fits) > self._limit:
                self._fits.popitem(last=False)

    def get(self, session: str) -> Optional[StoredFit]:
        with self._lock:
            return self._fits.get(session)

    def drop(self, session: str) -> Optional[StoredFit]:
        """Forget the tab's fit; the one it had, if any."""
        with self._lock:
            return self._fits.pop(session, None)
