"""When opt's steps end and how large each is: the cosine learning rate and the stop on a
stalled L1, shared by the loop on a device (torch, ``pipeline.texture.bake``) and the loop on
the host (``pipeline.texture.opt.host``), so both take the same steps."""

from __future__ import annotations

import math
from typing import Optional

FINAL_LR_FRACTION = 0.05       # cosine decay of Adam's lr to this fraction: L1 signs otherwise jitter by ~lr
# opt stops early when its L1 stalls: measured every STALL_WINDOW steps, a drop of less than
# STALL_DROP of it over the window is a stall; the lr then decays to its final value over
# STALL_TAIL more steps, so the texture still settles (L1's sign steps jitter by about lr).
# The default 120 steps on the toy: L1 0.0121 at step 54, 0.0120 from step 66 to 120.
STALL_WINDOW = 12
STALL_DROP = 0.005
STALL_TAIL = 8


def learning_rate(lr: float, fraction: float) -> float:
    """Adam's step size at ``fraction`` (0..1) of the run: cosine decay to FINAL_LR_FRACTION,
    since L1's sign gradients otherwise keep Adam's steps near lr to the end."""
    return lr * (FINAL_LR_FRACTION + (1 - FINAL_LR_FRACTION) * 0.5 * (1 + math.cos(math.pi * fraction)))


class StallSchedule:
    """Where opt's cosine lr schedule is, and when it ends: after ``steps``, or STALL_TAIL
    steps after its L1 stalled (dropped by less than STALL_DROP of itself over STALL_WINDOW
    steps); those last steps run the rest of the cosine, so the lr still ends at its final
    fraction. ``wants_loss(step)``: whether to measure L1 before that step's update and
    ``observe`` it."""

    @classmethod
    def for_settings(cls, steps: int, stop_when_stalled: bool) -> "StallSchedule":
        """The schedule of ``bake.steps`` (``bake.stop_when_stalled`` off: a window longer than
        the run, which never measures a stall, so every step runs)."""
        return cls(steps, window=STALL_WINDOW if stop_when_stalled else steps + 1)

    def __init__(self, steps: int, window: int = STALL_WINDOW, drop: float = STALL_DROP, tail: int = STALL_TAIL):
        self.steps, self.window, self.drop, self.tail = steps, window, drop, tail
        self.end = steps
        self.stalled_at = 0          # the step the stall was seen at (0: none)
        self._from = 0.0             # the cosine's fraction there
        self._last: Optional[float] = None

    def fraction(self, step: int) -> float:
        if not self.stalled_at or step <= self.stalled_at:
            return step / max(self.steps - 1, 1)
        return self._from + (1.0 - self._from) * (step - self.stalled_at) / max(self.end - 1 - self.stalled_at, 1)

    def plan(self, step: int, lr: float) -> tuple[float, bool, bool]:
        """For ``step``: (its learning rate, whether to measure L1 for ``observe``, whether to
        report progress after it: twenty times a run, and at its end)."""
        report_every = max(1, self.steps // 20)
        return (learning_rate(lr, self.fraction(step)), self.wants_loss(step),
                (step + 1) % report_every == 0 or step + 1 == self.end)

    def message(self, done: int, l1: float) -> str:
        """The progress line after ``done`` steps."""
        stalled = f" (L1 stalled at step {self.stalled_at}: ending)" if self.stalled_at else ""
        return f"step {done}/{self.end}, L1 {l1:.4f}{stalled}"

    def wants_loss(self, step: int) -> bool:
        return not self.stalled_at and step > 0 and step % self.window == 0

    def observe(self, step: int, l1: float) -> None:
        last, self._last = self._last, l1
        still_dropping = last is not None and last > 0 and last - l1 >= self.drop * last
        if last is None or still_dropping or step + self.tail >= self.steps:
            return
        self._from = self.fraction(step)
        self.stalled_at = step
        self.end = step + self.tail
