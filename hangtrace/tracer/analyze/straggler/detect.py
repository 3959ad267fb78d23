"""The decision: is one member of a group the slow one in its recent collectives? Pure.

In: one group's :class:`series.Instances`. Out: a :class:`Candidate` (who, by how much, in
which instances) or None. The rules and their thresholds (docs/STRAGGLERS.md says why):

Units: the window's steps (the newest :data:`WINDOW_STEPS`; a step's collectives judged
together, each member's arrivals summed over them: the first collective after the slow
work absorbs the whole wait), or its collectives when the job records no steps.

1. the candidate is the member that issued last in the most units of the window (the newest
   32 steps; else 16, else 8: a rank that became slow lately);
2. it is last in most of them (at least half; 3/4 of a shorter window) AND more often than chance would make a
   member of a group of n with arrivals in random order (probability 1/n per instance:
   the binomial tail of its count is below :data:`ALPHA`) - uniform noise names nobody;
3. its margin - the median over the units of its arrival minus the median arrival of the
   others - exceeds :data:`Z` robust standard deviations of the others' arrivals around
   their own median (1.4826 x MAD: the noise of the others), :data:`FLOOR_MS` and
   :data:`FLOOR_PCT` % of the step - tiny jitter never names anyone;
   3b. when its order alone is overwhelming - last in 3/4 of the units at a chance level
   below :data:`ALPHA_ORDER` - :data:`Z_ORDER` standard deviations suffice (the floors stay):
   a rank inside the others' spread is not last in nearly every step, so the order has
   already told it from them. Measured on the blind job tr_rank0_histograms (3 DDP ranks,
   rank 0's tracker thread holding the GIL 33 ms per step): the two others' DDP buckets
   arrived up to 70 ms apart (noise 37 ms) while rank 0 was last in 17 of 18 steps, a
   median 45 ms after them; 3 x 37 ms named nobody.

The added wait per step: per instance the gap between its arrival and the latest other
member's (what the group waited for it alone), summed over the window and divided by the
window's steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from hangtrace.tracer.analyze.straggler.series import Instances, _median, step_ms

#: robust standard deviations of the others' noise the margin must exceed
Z = 3.0
#: the margin must exceed this many ms ...
FLOOR_MS = 5.0
#: ... and this share of the step (%)
FLOOR_PCT = 5.0
#: chance level of the "last most often" count under random arrival order (binomial tail)
ALPHA = 1e-3
#: robust standard deviations when the order alone is overwhelming: last in 3/4 of the units
#: at a chance level below :data:`ALPHA_ORDER` (rule 3b of the module docstring)
Z_ORDER = 1.0
ALPHA_ORDER = 1e-6
#: newest steps (each instance its own when the job records no steps) the decision looks at
WINDOW_STEPS = 32
#: fewest steps a decision is made on
MIN_STEPS = 8
#: longest step (collectives of one group) the period of a stream without step numbers may have
MAX_PERIOD = 8
#: MAD -> standard deviation of a normal distribution
MAD_SD = 1.4826


@dataclass(frozen=True)
class Candidate:
    """A slow member of one group. ``col``: its column in ``inst.ranks``; ``last``: indices of
    the instances it issued last; ``margin_ms``: median arrival after the others' median;
    ``noise_ms``: the others' robust spread; ``added_ms``: added wait per step; ``step_ms``:
    the step time (None when unknown); ``steps``: steps (or instances) in the window;
    ``threshold_ms``: what the margin had to exceed."""

    inst: Instances
    col: int
    last: Tuple[int, ...]
    margin_ms: float
    noise_ms: float
    added_ms: float
    step_ms: Optional[float]
    steps: int
    threshold_ms: float
    last_steps: int = 0
    z: float = Z

    @property
    def rank(self) -> int:
        return self.inst.ranks[self.col]


def binom_tail(n: int, k: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p)."""
    if k <= 0:
        return 1.0
    return min(1.0, sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1)))


def mad(xs: Sequence[float]) -> float:
    """Median absolute deviation from the median (0 for no values)."""
    if not xs:
        return 0.0
    m = _median(xs)
    return _median([abs(x - m) for x in xs])


def units(inst: Instances, newest: int) -> List[List[int]]:
    """The newest ``newest`` steps of ``inst`` as lists of instance indices (a step's
    collectives are judged together: the first one after the slow work absorbs the wait).
    By the records' step numbers (instances without one, before the job's first
    ``tracer.step``, left out); without any, by the period of the group's collective stream
    (:func:`period`: a loop that issues a training all-reduce and a flag all-reduce each
    iteration has period 2), each instance its own unit when it has none."""
    steps = [rs[0].step for rs in inst.by_rank]
    if all(s is None for s in steps):
        p, extra = period_tail([(rs[0].op, rs[0].numel) for rs in inst.by_rank])
        n = len(steps) - extra  # (a barrier at the end of a finished run is no step)
        return [list(range(i, i + p)) for i in range(n % p, n, p)][-newest:]
    out: Dict[int, List[int]] = {}
    for i, s in enumerate(steps):
        if s is not None:
            out.setdefault(s, []).append(i)
    return [out[k] for k in sorted(out)][-newest:]


def period_tail(keys: Sequence[Tuple[str, int]]) -> Tuple[int, int]:
    """``(p, extra)``: the stream's :func:`period` once its newest ``extra`` keys (fewer than
    :data:`MAX_PERIOD`; the fewest that leave a period) are left out - a finished run's rings
    end with its teardown (a ``dist.barrier()`` before ``destroy_process_group``: measured on
    the blind job mp_slow_from_start, whose 6 all-reduces per step then read as no period
    and named nobody); ``(1, 0)`` when no such period."""
    for extra in range(MAX_PERIOD):
        p = period(keys[: len(keys) - extra])
        if p > 1:
            return p, extra
    return 1, 0


def period(keys: Sequence[Tuple[str, int]]) -> int:
    """The shortest p (at most :data:`MAX_PERIOD`) whose blocks repeat over the newest
    ``MIN_STEPS`` x p keys (op, numel), else 1."""
    n = len(keys)
    for p in range(2, MAX_PERIOD + 1):
        span = MIN_STEPS * p
        if span > n:
            break
        tail = keys[n - span :]
        if all(tail[i] == tail[i % p] for i in range(span)) and len(set(tail[:p])) > 1:
            return p
    return 1


def unit_arrivals(inst: Instances, us: Sequence[Sequence[int]]) -> List[List[float]]:
    """Per unit, each member's arrival summed over the unit's instances (ns)."""
    n = len(inst.ranks)
    return [[sum(inst.arrival[i][j] for i in u) for j in range(n)] for u in us]


def _last_col(row: Sequence[float]) -> int:
    """The column that arrived last (ties: the lower column)."""
    return list(row).index(max(row))


def _others(row: Sequence[float], col: int) -> List[float]:
    return [a for j, a in enumerate(row) if j != col]


def candidate(inst: Instances) -> Optional[Candidate]:
    """The slow member of ``inst`` by the rules of the module docstring, or None: judged over
    the newest :data:`WINDOW_STEPS` steps, else (a rank slow for fewer steps than half of
    them: it became slow lately) the newest half, else the newest quarter - each at the same
    chance level, and last in at least 3/4 of a shorter window (a rank that became slow is
    last in nearly all its slow steps; measured: 84-97 % on the real jobs; exponential noise
    on 8 ranks made one rank last in 8 of 16 steps once in 100 seeds)."""
    for w, share in ((WINDOW_STEPS, 0.5), (WINDOW_STEPS // 2, 0.75), (WINDOW_STEPS // 4, 0.75)):
        c = _judge(inst, units(inst, w), share)
        if c is not None:
            return c
    return None


def _judge(inst: Instances, us: List[List[int]], share: float) -> Optional[Candidate]:
    """:func:`candidate` over the units ``us``; the candidate must be last in ``share`` of them."""
    n = len(inst.ranks)
    k_all = len(us)
    if k_all < MIN_STEPS or n < 2:
        return None
    arr = unit_arrivals(inst, us)
    lasts = [_last_col(row) for row in arr]
    counts: Dict[int, int] = {}
    for c in lasts:
        counts[c] = counts.get(c, 0) + 1
    col, k = max(counts.items(), key=lambda kv: (kv[1], -kv[0]))
    if k < share * k_all or binom_tail(k_all, k, 1.0 / n) > ALPHA:
        return None
    margins: List[float] = []
    spread: List[float] = []
    for row in arr:
        oth = _others(row, col)
        mo = _median(oth)
        margins.append(row[col] - mo)
        spread.extend(a - mo for a in oth)
    idx = [i for u in us for i in u]
    gaps = sum(max(0.0, inst.arrival[i][col] - max(_others(inst.arrival[i], col))) for i in idx)
    margin = _median(margins) / 1e6
    noise = MAD_SD * mad(spread) / 1e6 if n > 2 else 0.0
    st, steps = step_ms(inst, us), k_all
    z = Z_ORDER if k >= 0.75 * k_all and binom_tail(k_all, k, 1.0 / n) <= ALPHA_ORDER else Z
    threshold = max(z * noise, FLOOR_MS, FLOOR_PCT / 100.0 * st if st else 0.0)
    if margin <= threshold:
        return None
    return Candidate(
        inst=inst,
        col=col,
        last=tuple(i for i in idx if _last_col(inst.arrival[i]) == col),
        margin_ms=margin,
        noise_ms=noise,
        added_ms=gaps / 1e6 / max(1, steps),
        step_ms=st,
        steps=steps,
        threshold_ms=threshold,
        last_steps=k,
        z=z,
    )
