"""Level the colours of several photos of one object so that no edge shows where one hands
over to the next.

Two photos of the same surface rarely agree: the camera's exposure and white balance differ
from shot to shot, and so does the light. Where the bake hands a texel over from one photo
to the next, such a difference is a visible step. After "Let There Be Color!" (Waechter,
Moehrle and Goesele, 2014), which levels per-vertex offsets over the whole model after
choosing a view per face, Kiln solves one small global least-squares problem, here per
photo and per channel:

    corrected_i = gain_i * colour_i + offset_i

chosen so that, wherever two photos see the same surface point well, their corrected colours
agree. The photos' mean gain is held at 1 (a constraint, not a prior: the differences alone
would shrink every gain towards 0, which levels everything to black), so the common level is
the photos' own average; a weak prior towards gain 1, offset 0 settles what the seams leave
open. A gain is what an
exposure or a white balance changes (a power-law tone curve keeps a gain a gain); the offset,
regularised harder, takes a flare or black-level difference. The residual is weighted
robustly (iteratively reweighted, Huber), so a highlight that one photo sees and the other
does not, or texels misregistered by a slightly wrong camera, do not drag the solution.

Where two photos see no texel in common, texels where each is the chosen photo that lie
within ``ADJACENT_FRACTION`` of the object's size of each other stand in: a smooth surface
has nearly the same colour a short step away. Photos that share neither are levelled only
through others (or not at all, when nothing links them), and the report says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from pipeline.validate import StageInputError, check_array

OVERLAP_WEIGHT = 0.25        # both photos' weights at least this: a texel both see, not at a grazing edge
MIN_PAIR_TEXELS = 50         # fewer shared texels than this do not level a pair
MAX_PAIR_TEXELS = 20_000     # texels per pair used (evenly spaced): the unknowns are few
RAMP_TOP = 0.999            # a weight below this is on its photo's hand-over ramp
ADJACENT_FRACTION = 0.01     # neighbours across a handover with no overlap, as a share of the object's size
GAIN_PRIOR = 0.01            # regularisation towards gain 1 (per unit of mean squared colour difference)
MEAN_GAIN_WEIGHT = 100.0     # the constraint "mean gain = 1" as a row this heavy: held to ~1e-4
OFFSET_PRIOR = 0.2           # towards offset 0: harder, so a gain explains what a gain can
HUBER = 0.02                 # colour difference (0-1) beyond which a pair counts as an outlier
IRLS_ROUNDS = 4


@dataclass(frozen=True)
class Levelling:
    """Per photo (P of them) and channel: gain (P, 3) and offset (P, 3) for colours in [0, 1];
    pairs: (i, j, texels, how) for each pair of photos that constrained the solution, ``how``
    "overlap" or "adjacent"; before/after: the median colour difference (0-255 units, max over
    channels) over those pairs' texels, before and after levelling."""

    gain: np.ndarray
    offset: np.ndarray
    pairs: tuple[tuple[int, int, int, str], ...] = ()
    before: float = 0.0
    after: float = 0.0
    linked: tuple[bool, ...] = field(default_factory=tuple)

    def apply(self, i: int, colors: np.ndarray) -> np.ndarray:
        """Photo ``i``'s colours (N, 3) levelled, clipped to [0, 1]."""
        return np.clip(colors * self.gain[i] + self.offset[i], 0.0, 1.0).astype(np.float32)

    def report(self, i: int) -> dict:
        return {"gain": [round(float(v), 4) for v in self.gain[i]],
                "offset": [round(float(v), 4) for v in self.offset[i]],
                "linked": bool(self.linked[i]) if self.linked else False}


def identity(count: int) -> Levelling:
    return Levelling(gain=np.ones((count, 3)), offset=np.zeros((count, 3)), linked=(False,) * count)


def level_photos(colors: Sequence[np.ndarray], weights: Sequence[np.ndarray], chosen: np.ndarray,
                 positions: np.ndarray) -> Levelling:
    """The gains and offsets that level P photos' colours of the same N texels.

    colors:    P arrays (N, 3) float32 in [0, 1], each photo's colour at each texel
    weights:   P arrays (N,) float32 in [0, 1], each photo's trust there (0: it does not see it)
    chosen:    (N,) int, the photo that colours each texel (-1: none), for the adjacent pairs
    positions: (N, 3) float32 surface points of the texels
    """
    p = len(colors)
    if p != len(weights):
        raise StageInputError(f"{p} photos' colours but {len(weights)} photos' weights")
    n = len(positions)
    for i in range(p):
        check_array(f"photo {i + 1}'s texel colours", colors[i], dtype=np.float32, shape=(n, 3))
        check_array(f"photo {i + 1}'s texel weights", weights[i], dtype=np.float32, shape=(n,))
    if p < 2:
        return identity(p)
    rows: list[tuple[int, int, np.ndarray, np.ndarray, np.ndarray]] = []   # (i, j, ci, cj, w)
    pairs = []
    size = float(np.ptp(positions, axis=0).max()) if n else 1.0
    for i in range(p):
        for j in range(i + 1, p):
            got = _pair_samples(i, j, colors, weights, chosen, positions, size)
            if got is None:
                continue
            ci, cj, w, how = got
            rows.append((i, j, ci, cj, w))
            pairs.append((i, j, int(len(w)), how))
    if not rows:
        return identity(p)
    linked = [False] * p
    for i, j, *_ in rows:
        linked[i] = linked[j] = True
    gain, offset = np.ones((p, 3)), np.zeros((p, 3))
    for ch in range(3):
        gain[:, ch], offset[:, ch] = _solve_channel(p, [(i, j, ci[:, ch], cj[:, ch], w) for i, j, ci, cj, w in rows])
    before = _median_step(rows, np.ones((p, 3)), np.zeros((p, 3)))
    after = _median_step(rows, gain, offset)
    if after >= before:
        # levelling does not help: photos that already agree (renders of one exposure) leave
        # the gains to what their differences cannot pin down, e.g. thin coloured lines on
        # black, misregistered by a fraction of a pixel between two resamplings; gains of
        # 0.93-1.17 on every line of every photo cost the capsule's 4 photo views 1.4 dB each
        # (bench/allround.py: median step 1.18 before, 1.32 after)
        return Levelling(gain=np.ones((p, 3)), offset=np.zeros((p, 3)), pairs=tuple(pairs), before=before,
                         after=before, linked=tuple(linked))
    return Levelling(gain=gain, offset=offset, pairs=tuple(pairs), before=before, after=after,
                     linked=tuple(linked))


def _pair_samples(i: int, j: int, colors, weights, chosen: np.ndarray, positions: np.ndarray, size: float):
    """(colours of i (M, 3), colours of j (M, 3), weights (M,), how) for a pair of photos, or None."""
    both = np.flatnonzero((weights[i] >= OVERLAP_WEIGHT) & (weights[j] >= OVERLAP_WEIGHT))
    if len(both) >= MIN_PAIR_TEXELS:
        both = _spaced(both)
        w = np.minimum(weights[i][both], weights[j][both]).astype(np.float64)
        return colors[i][both].astype(np.float64), colors[j][both].astype(np.float64), w, "overlap"
    from scipy.spatial import cKDTree

    # no shared texels: the texels each photo colours, a short step apart across the handover.
    # Without overlap a region ends where its photo's weight ramps down (a grazing angle, an
    # occlusion or the mask's edge), so only its ramp (weight < 1) can lie next to the other's
    a = np.flatnonzero((chosen == i) & (weights[i] >= OVERLAP_WEIGHT) & (weights[i] < RAMP_TOP))
    b = np.flatnonzero((chosen == j) & (weights[j] >= OVERLAP_WEIGHT) & (weights[j] < RAMP_TOP))
    if len(a) < MIN_PAIR_TEXELS or len(b) < MIN_PAIR_TEXELS:
        return None
    dist, idx = cKDTree(positions[b]).query(positions[a], distance_upper_bound=ADJACENT_FRACTION * size,
                                            workers=-1)
    near = np.isfinite(dist)
    if int(near.sum()) < MIN_PAIR_TEXELS:
        return None
    ka, kb = a[near], b[idx[near]]
    keep = _spaced(np.arange(len(ka)))
    ka, kb = ka[keep], kb[keep]
    w = np.minimum(weights[i][ka], weights[j][kb]).astype(np.float64)
    return colors[i][ka].astype(np.float64), colors[j][kb].astype(np.float64), w, "adjacent"


def _spaced(idx: np.ndarray) -> np.ndarray:
    if len(idx) <= MAX_PAIR_TEXELS:
        return idx
    return idx[np.linspace(0, len(idx) - 1, MAX_PAIR_TEXELS).round().astype(int)]


def _solve_channel(p: int, rows) -> tuple[np.ndarray, np.ndarray]:
    """(gain (P,), offset (P,)) for one channel: weighted, robust least squares over the pairs'
    equations gain_i c_i + offset_i = gain_j c_j + offset_j, with the priors as extra rows.
    Unknowns x = [gain_0..gain_P-1, offset_0..offset_P-1]."""
    blocks, data_w, total = [], [], 0.0
    for i, j, ci, cj, w in rows:
        a = np.zeros((len(w), 2 * p))
        a[:, i], a[:, p + i] = ci, 1.0
        a[:, j], a[:, p + j] = -cj, -1.0
        blocks.append(a)
        data_w.append(w)
        total += float(w.sum())
    a = np.concatenate(blocks)
    # each pair's equations averaged by its weight, all pairs together summing to 1: the priors
    # then mean the same whatever the number of texels
    w0 = np.concatenate(data_w) / max(total, 1e-12)
    prior = np.zeros((2 * p, 2 * p))
    prior[:p, :p] = np.eye(p) * GAIN_PRIOR
    prior[p:, p:] = np.eye(p) * OFFSET_PRIOR
    target = np.concatenate([np.ones(p) * GAIN_PRIOR, np.zeros(p)])
    mean_gain = np.zeros((1, 2 * p))
    mean_gain[0, :p] = MEAN_GAIN_WEIGHT / p
    prior = np.concatenate([prior, mean_gain])
    target = np.concatenate([target, [MEAN_GAIN_WEIGHT]])
    robust = np.ones(len(w0))
    x = np.concatenate([np.ones(p), np.zeros(p)])
    for _ in range(IRLS_ROUNDS):
        sw = np.sqrt(w0 * robust)
        lhs = np.concatenate([a * sw[:, None], prior])
        rhs = np.concatenate([np.zeros(len(w0)), target])
        x = np.linalg.lstsq(lhs, rhs, rcond=None)[0]
        r = np.abs(a @ x)
        robust = np.where(r <= HUBER, 1.0, HUBER / np.maximum(r, 1e-12))
    return x[:p], x[p:]


def _median_step(rows, gain: np.ndarray, offset: np.ndarray) -> float:
    """Median over the pairs' texels of the largest channel's colour difference, in 0-255 units."""
    diffs = []
    for i, j, ci, cj, _ in rows:
        a = np.clip(ci * gain[i] + offset[i], 0, 1)
        b = np.clip(cj * gain[j] + offset[j], 0, 1)
        diffs.append(np.abs(a - b).max(axis=1))
    return round(255.0 * float(np.median(np.concatenate(diffs))), 2)
