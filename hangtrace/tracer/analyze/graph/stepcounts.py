"""Per-step collective counts: which side of a tie issued one too many, or one too few.

When two ranks (or two equal halves) stand at the same sequence number of a group in
different collectives, counts alone cannot say who diverged. The flight record can: every
collective record carries the step it was issued in (``tracer.step``). In the steps both
ranks completed, a healthy loop issues the same number of collectives on the group per
step (the *baseline*). At the step where the ranks diverged, the rank that issued more
than the baseline did extra work (a data-dependent loop that ran once more, a rank-0-only
checkpoint); the rank that issued fewer skipped one. That rank is named; when both or
neither deviate, there is no answer and the tie stands.

Pure; reads only the records kept in the snapshot (the recent tail suffices: the baseline
needs two completed steps before the divergence).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from hangtrace.tracer.analyze.rankview import Record
from hangtrace.tracer.analyze.context import history
from hangtrace.tracer.snapshot import ProcessInfo


@dataclass(frozen=True)
class StepDeviation:
    """``rank`` issued ``count`` collectives on ``group`` in ``step`` where the steps
    before show ``baseline`` per step; ``extra`` True when count > baseline."""

    rank: int
    group: str
    step: int
    count: int
    baseline: int

    @property
    def extra(self) -> bool:
        return self.count > self.baseline

    def line(self) -> str:
        what = (
            "one more"
            if self.count == self.baseline + 1
            else (
                "one fewer"
                if self.count == self.baseline - 1
                else "%d instead of %d" % (self.count, self.baseline)
            )
        )
        return (
            "rank %d issued %s collective(s) on group '%s' in step %d than in each earlier step "
            "(%d per step)" % (self.rank, what, self.group, self.step, self.baseline)
        )


def per_step(records: Iterable[Mapping[str, Any]], group: str) -> Dict[int, int]:
    """{step: number of collectives issued on ``group`` in that step} (step -1/None skipped)."""
    c: "Counter[int]" = Counter()
    for r in records:
        if r.get("kind") == "collective" and r.get("group") == group:
            s = r.get("step")
            if s is not None and s >= 0:
                c[int(s)] += 1
    return dict(c)


def _baseline(counts: Mapping[int, int], before: int, whole: bool) -> Optional[int]:
    """The per-step count all complete steps before ``before`` agree on, else None.
    ``whole``: the history starts at the process's first record (the ring did not wrap);
    otherwise the first step seen is skipped (the ring may start in the middle of it) and
    two steps are needed."""
    steps = sorted(s for s in counts if s < before)
    if not whole:
        steps = steps[1:]
    vals = {counts[s] for s in steps}
    return vals.pop() if len(steps) >= (1 if whole else 2) and len(vals) == 1 else None


def deviations(procs: Mapping[int, ProcessInfo], group: str, ranks: Sequence[int]) -> List[StepDeviation]:
    """For the tied ``ranks`` of ``group``: each rank whose count in its current step
    differs from the baseline shared by all of them. Empty when no common baseline exists.
    The current step of a rank is the step of its newest record on the group."""
    tables: Dict[int, Tuple[Dict[int, int], int]] = {}
    hists: Dict[int, List[Record]] = {}
    whole: Dict[int, bool] = {}
    for r in ranks:
        p = procs.get(r)
        if p is None:
            return []
        hist = hists[r] = history(p)
        counts = per_step(hist, group)
        if not counts:
            return []
        tables[r] = (counts, max(counts))
        whole[r] = bool(hist) and hist[0].get("idx") == 1
    first = min(cur for _, cur in tables.values())
    bases = {_baseline(counts, first, whole[r]) for r, (counts, _) in tables.items()}
    if len(bases) != 1 or None in bases:
        return []
    base = bases.pop()
    assert base is not None
    out = []
    for r, (counts, cur) in sorted(tables.items()):
        # a rank already in a later step completed ``first``: compare that step
        n = counts.get(first, 0)
        if n > base:
            # only collectives of the phases the loop's steps used count as "one more": a
            # rank that left its loop into another phase (eval's barrier) without a new
            # step did not issue one more in the loop (blind ddp_extra_batch)
            n = _in_loop_phases(hists[r], group, first)
        if n != base:
            out.append(StepDeviation(r, group, first, n, base))
    return out


def _in_loop_phases(records: Sequence[Mapping[str, Any]], group: str, step: int) -> int:
    """Collectives on ``group`` in ``step`` whose phase one of the earlier steps' collectives
    on the group had (all of them when the earlier steps recorded no phase)."""
    coll = [
        (int(r["step"]), r.get("phase"))
        for r in records
        if r.get("kind") == "collective"
        and r.get("group") == group
        and r.get("step") is not None
        and int(r["step"]) >= 0
    ]
    loop = {ph for st, ph in coll if st < step}
    return sum(1 for st, ph in coll if st == step and (ph in loop or not loop))


def tie_breaker(
    procs: Mapping[int, ProcessInfo], group: str, ranks: Sequence[int]
) -> Optional[StepDeviation]:
    """The one rank among ``ranks`` whose per-step count deviates, or None (none or several)."""
    devs = deviations(procs, group, ranks)
    return devs[0] if len(devs) == 1 else None
