"""The worker layer's own errors, in a leaf that the pool and every engine import (as
``concurrent.futures._base`` holds its exceptions below ``process`` and ``thread``), so an
engine never imports the dispatcher back."""


class WorkerStartError(RuntimeError):
    """No worker could be started; the message carries the reason and the log's tail."""
