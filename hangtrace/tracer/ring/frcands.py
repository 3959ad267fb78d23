"""One process group's Flight Recorder collectives indexed by launch time. Pure.

In: the FR record dicts of one group (``ring/frrecords.fr_records``, launch order). Out:
``Cands``: the ones launched within a time window and the highest seq launched before a
time, in O(log n) each; read by ``frrecords.merge_records`` to pair our collectives with
torch's (issue 40: a linear scan per record made joining 4,096 ranks quadratic).
"""

from __future__ import annotations

import bisect
import math
from typing import Any, Dict, List


class Cands:
    """One group's FR collectives (launch order) indexed by start time: the ones within a
    call's time window, and the highest seq before a time, in O(log n) plus what is found
    (a linear scan per record made the join of 4,096 ranks' rings quadratic: issue 40)."""

    __slots__ = ("items", "order", "ts", "maxseq", "ints")

    def __init__(self, items: List[Dict[str, Any]]) -> None:
        self.items = items
        self.order = sorted(range(len(items)), key=lambda i: items[i]["t_wall_ns"])
        self.ts = [items[i]["t_wall_ns"] for i in self.order]
        # all ints (torch's ns): a float bound is compared as the int it admits the same
        # ints with (a float against an int past 2**53 is a slow comparison: a third of the
        # pairing's cost, issue 40)
        self.ints = all(type(t) is int for t in self.ts)
        best: Any = None
        self.maxseq: List[Any] = []
        for i in self.order:
            q = items[i]["seq"]
            best = q if best is None or (q is not None and q > best) else best
            self.maxseq.append(best)

    def within(self, lo_ns: float, hi_ns: float) -> List[Dict[str, Any]]:
        """The entries with ``lo_ns <= t_wall_ns <= hi_ns``, in launch order."""
        if self.ints:
            lo_ns, hi_ns = int_bound(lo_ns, False), int_bound(hi_ns, True)
        a, b = bisect.bisect_left(self.ts, lo_ns), bisect.bisect_right(self.ts, hi_ns)
        return [self.items[i] for i in sorted(self.order[a:b])]

    def max_seq_before(self, t_ns: float) -> Any:
        """The highest seq of the entries started before ``t_ns``, None when none did."""
        a = bisect.bisect_left(self.ts, int_bound(t_ns, False) if self.ints else t_ns)
        return self.maxseq[a - 1] if a else None


def int_bound(t: Any, upper: bool) -> Any:
    """For comparisons with ints only: a finite float ``t`` as the int that the same ints
    are below (``upper`` False: ``x < t`` iff ``x < ceil(t)``) or at most (``upper``:
    ``x <= t`` iff ``x <= floor(t)``); anything else as it is."""
    if type(t) is float and math.isfinite(t):
        return math.floor(t) if upper else math.ceil(t)
    return t
