"""Since when a straggler is slow, and in which of its phases its extra time goes. Pure.

In: a :class:`detect.Candidate` and the histories (``RingSummary.history``) of its rank and
of up to :data:`MAX_REF` other members of its group. Out: the first slow step (a change
point in its own history) and a phase name.

*Since when*: over the longest stretch its history shares with the reference members, the
series of its arrival minus their median arrival per step (``detect.units``). The change point
is the split of that series into two levels - before and after - that fits it best with each
part's median (the least sum of absolute deviations: a robust two-level fit; a step late by a
few ms of noise before the slowdown stays with "before", a step only a little late after it
stays with "after"). It is taken when: at least :data:`MIN_BEFORE` steps lie before it; after
it the median is above the cut the decision used (``detect``: 3 x the others' noise, the floors,
or half its margin, whichever is lower); before it the median is at most a third of the median
after (the rank was one of the others, not merely less slow) and at most a third of the steps
are nearer the level after than the level before. The split then moves back over the
unbroken run of steps late by more than the cut that leads into it when most of that run is
later than every step before it (else it is noise late by more than the cut: 7, 12, 12 ms after
noise up to 26 ms, then +45 ms; 7 ms after noise up to 9 ms, then +15 ms): a slowdown whose extra time ramps up (a CI
run: +6 to +24 ms in its first 6 slow steps, +23 to +63 ms later, noise up to 10 ms before)
was fitted 6 steps late, its first steps nearer the level before. No such split (slow from its oldest
recorded steps on): unknown (None; the report says "since before step N", the oldest
compared), unless the oldest step holds the group's first collective. (Measured: the cut
alone - every step late by more than it counted slow - put the start of a step-20 slowdown at
step 11 beside a CPU burner on 2 cores, where any rank is late by 5-10 ms in some steps.)

*Phase*: per phase, its own time in the phase per slow step (phase exit minus enter on its
own clock, minus its time inside collectives recorded in that phase: the waiting) against
the median of the reference members'; the innermost phase whose excess is at least half the
added wait (and :data:`detect.FLOOR_MS`). Without phase timings that tell (DDP's C++
all-reduce waits inside the phase of backward, unrecorded): the phase it most often issued
its late collectives in.
"""

from __future__ import annotations

import bisect
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from hangtrace.tracer.analyze.straggler.detect import FLOOR_MS, Candidate, unit_arrivals, units
from hangtrace.tracer.analyze.straggler.series import _median, by_group, collective_rows, instances
from hangtrace.tracer.ring.summary import HISTORY
from hangtrace.tracer.ring.timingrows import Row, rows

#: other members read for the change point and the phase comparison
MAX_REF = 16
#: steps before a change point, at most a third of them slow (fewer: not told from noise)
MIN_BEFORE = 4


def reference(cand: Candidate) -> List[int]:
    """Up to :data:`MAX_REF` other members of the candidate's group, spread over its ranks."""
    others = [r for r in cand.inst.ranks if r != cand.rank]
    if len(others) <= MAX_REF:
        return others
    step = len(others) / float(MAX_REF)
    return [others[int(i * step)] for i in range(MAX_REF)]


def since(cand: Candidate, histories: Mapping[int, Sequence[Any]]) -> Tuple[Optional[int], Optional[int]]:
    """``(first slow step, oldest step compared)`` (module docstring); either may be None."""
    ranks = [cand.rank] + reference(cand)
    coll = collective_rows({r: histories[r] for r in ranks if r in histories}, HISTORY)
    members = by_group(coll).get(cand.inst.group, {})
    inst = instances(cand.inst.group, members, window=HISTORY)
    if inst is None or cand.rank not in inst.ranks:
        return None, None
    col = inst.ranks.index(cand.rank)
    mid = min(cand.threshold_ms, cand.margin_ms / 2.0) * 1e6
    us = units(inst, HISTORY)
    late = []
    for row in unit_arrivals(inst, us):
        oth = [a for j, a in enumerate(row) if j != col]
        late.append(row[col] - _median(oth))
    steps = [inst.by_rank[u[0]][col].step for u in us]
    oldest = steps[0] if steps else None
    k = split(late, mid)
    if k is not None:
        return steps[k], oldest
    if late and inst.seqs and inst.seqs[0] <= 1 and 3 * sum(x <= mid for x in late) <= len(late):
        return steps[0], oldest  # slow from the group's first collective on
    return None, oldest


def _deviations(xs: Sequence[float]) -> List[float]:
    """``out[i]``: the sum of absolute deviations of ``xs[:i]`` from their median (i >= 1;
    ``out[0]`` 0): a sorted prefix grows by insertion, and the deviations are the upper half's
    sum minus the lower half's. O(n^2) element moves, in C."""
    s: List[float] = []
    out = [0.0]
    for x in xs:
        bisect.insort(s, x)
        h = len(s) // 2
        out.append(sum(s[len(s) - h :]) - sum(s[:h]))
    return out


def split(late: Sequence[float], cut: float) -> Optional[int]:
    """The index of the first slow step of the series ``late`` (ns per step, oldest first) by
    the two-level fit of the module docstring, or None when no split passes its tests
    (``cut``: ns, the decision's). O(n^2) for n steps, in C (n <= ~170: a ring's history)."""
    pre, post = _deviations(late), _deviations(late[::-1])
    n = len(late)
    best: Optional[Tuple[float, int]] = None
    for k in range(MIN_BEFORE, n):
        cost = pre[k] + post[n - k]
        if best is None or cost < best[0]:
            best = (cost, k)
    if best is None:
        return None
    k = best[1]
    before, after = _median(late[:k]), _median(late[k:])
    level = (before + after) / 2.0
    if after <= cut or before > after / 3.0 or 3 * sum(x > level for x in late[:k]) > k:
        return None
    j = k
    while j > MIN_BEFORE and late[j - 1] > cut:  # the run of late steps leading into the split
        j -= 1
    run = late[j:k]
    noise = max(late[:j])
    return j if run and 2 * sum(x > noise for x in run) > len(run) else k


def _busy(hist: Sequence[Any]) -> Dict[Tuple[str, Optional[int]], int]:
    """``{(phase, step): ns in the phase outside recorded collectives}`` of one history."""
    spans = rows(hist, ("phase_enter", "phase_exit"))
    spans.reverse()  # oldest first
    open_: Dict[str, Row] = {}
    out: Dict[Tuple[str, Optional[int]], int] = {}
    for r in spans:
        if r.phase is None:
            continue
        if r.kind == "phase_enter":
            open_[r.phase] = r
        elif r.phase in open_:
            e = open_.pop(r.phase)
            if r.t_mono_ns >= e.t_mono_ns > 0:
                key = (r.phase, e.step)
                out[key] = out.get(key, 0) + r.t_mono_ns - e.t_mono_ns
    for c in rows(hist, ("collective",)):
        key = (str(c.phase), c.step)
        if c.phase is not None and c.dur_ns > 0 and key in out:
            out[key] -= c.dur_ns
    return out


def _own(
    busy: Mapping[Tuple[str, Optional[int]], int], phase: str, steps: Set[Optional[int]]
) -> Optional[float]:
    vals = [float(v) for (p, s), v in busy.items() if p == phase and s in steps]
    return _median(vals) / 1e6 if vals else None


def phase(cand: Candidate, histories: Mapping[int, Sequence[Any]]) -> Optional[str]:
    """The phase its extra time goes in (module docstring), or None."""
    steps = {cand.inst.by_rank[i][cand.col].step for i in cand.last}
    mine = _busy(histories.get(cand.rank) or ())
    refs = [_busy(histories.get(r) or ()) for r in reference(cand)]
    found: List[Tuple[float, str]] = []
    for p in sorted({p for p, _ in mine}):
        own = _own(mine, p, steps)
        theirs = [x for x in (_own(b, p, steps) for b in refs) if x is not None]
        if own is None or not theirs:
            continue
        if own - _median(theirs) >= max(FLOOR_MS, cand.added_ms / 2.0):
            found.append((own, p))
    if found:
        return min(found)[1]
    late = [cand.inst.by_rank[i][cand.col].phase for i in cand.last]
    named = [p for p in late if p]
    return max(sorted(set(named)), key=named.count) if named else None
