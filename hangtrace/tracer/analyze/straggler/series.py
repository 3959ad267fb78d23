"""Per group, the recent collectives every member issued, as arrival times. Pure.

In: ``{global rank: RingSummary.history}`` (``ring/timingrows.py`` reads them). Out:
:class:`Instances` per group: the newest seqs every member of the group has in its history
(``rows``), and for each seq each member's *arrival* (ns after the first member issued it).

Arrival, per instance: ``t_wall_r - min(t_wall)``, the issue times on the wall clock (ours,
or torch's ``time_created_ns`` of a Flight Recorder entry: C++-issued collectives). Hosts'
clocks must agree to well under the margin floor (``detect.FLOOR_MS``; NTP keeps them within
about a millisecond). Not the durations (``max(dur) - dur_r``, which no clock offset
enters): measured on a real 4-rank gloo job at load 15, gloo's ranks leave one all-reduce
up to 20 ms apart, so the durations named nobody where the issue times were clear.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from hangtrace.tracer.ring.timingrows import Row, rows

#: newest common instances per group read for the decision (``detect`` keeps its steps)
WINDOW = 96
#: collective rows read per rank for the decision (newest first; several groups share them)
READ = 2 * WINDOW


@dataclass(frozen=True)
class Instances:
    """One group's recent instances. ``ranks``: members (sorted); ``seqs``: ascending;
    ``arrival[i][j]``: ns after the first arrival of member ``ranks[j]`` at ``seqs[i]``;
    ``wall[i]``: the newest issue time of instance i (ns, epoch); ``by_rank[i][j]``: member
    ``ranks[j]``'s row of instance i (its step and phase)."""

    group: str
    ranks: Tuple[int, ...]
    seqs: Tuple[int, ...]
    arrival: Tuple[Tuple[float, ...], ...]
    wall: Tuple[int, ...]
    by_rank: Tuple[Tuple[Row, ...], ...]


def collective_rows(histories: Mapping[int, Sequence[Any]], newest: int = READ) -> Dict[int, List[Row]]:
    """``{rank: its newest collective rows, newest first}``."""
    return {r: rows(h, ("collective",), newest) for r, h in histories.items() if h}


def more_rows(
    histories: Mapping[int, Sequence[Any]], have: Mapping[int, List[Row]], newest: int
) -> Dict[int, List[Row]]:
    """:func:`collective_rows` ``(histories, newest)`` for a reader that already ``have``
    ``collective_rows(histories, n)`` with ``n <= newest``: only the older rows are unpacked
    (at 4,096 ranks, reading the newest rows twice was a quarter of the pass)."""
    out: Dict[int, List[Row]] = {}
    for r, h in histories.items():
        if h:
            got = have.get(r, [])
            out[r] = (
                got + rows(h, ("collective",), newest, skip=len(got)) if len(got) < newest else got[:newest]
            )
    return out


def by_group(coll: Mapping[int, List[Row]]) -> Dict[str, Dict[int, Dict[int, Row]]]:
    """``{group: {rank: {seq: row}}}`` (of equal seqs on one rank, the newest row)."""
    out: Dict[str, Dict[int, Dict[int, Row]]] = {}
    for rank, rs in coll.items():
        for r in rs:
            if r.group is None:
                continue
            out.setdefault(r.group, {}).setdefault(rank, {}).setdefault(r.seq, r)
    return out


def arrivals(rs: Sequence[Row]) -> List[float]:
    """Arrival (ns after the first) of each member's row of one instance (module docstring)."""
    first = min(r.t_wall_ns for r in rs)
    return [float(r.t_wall_ns - first) for r in rs]


def instances(
    group: str, members: Mapping[int, Mapping[int, Row]], window: int = WINDOW
) -> Optional[Instances]:
    """The newest ``window`` seqs of ``group`` that every member in ``members`` ({rank: {seq:
    row}}) has, as :class:`Instances`; None with fewer than two members or no common seq."""
    if len(members) < 2:
        return None
    ranks = tuple(sorted(members))
    common = set(members[ranks[0]])
    for r in ranks[1:]:
        common &= members[r].keys()
    if not common:
        return None
    seqs = tuple(sorted(common)[-window:])
    cols = [members[r] for r in ranks]
    arrival, wall, by_rank = [], [], []
    for s in seqs:  # (at 4,096 ranks the pass's largest term: lookups hoisted, no per-row attributes)
        rs = tuple([c[s] for c in cols])
        walls = list(map(_T_WALL, rs))
        first = min(walls)
        arrival.append(tuple([float(w - first) for w in walls]))
        wall.append(max(walls))
        by_rank.append(rs)
    return Instances(group, ranks, seqs, tuple(arrival), tuple(wall), tuple(by_rank))


_T_WALL = operator.itemgetter(Row._fields.index("t_wall_ns"))


def step_ms(inst: Instances, units: Sequence[Sequence[int]]) -> Optional[float]:
    """The step time in ms over ``units`` (``detect.units``: lists of indices into
    ``inst.seqs``): the median wall time between the first instances of consecutive units,
    per step number when the records have them; None with fewer than two units."""
    gaps = []
    for a, b in zip(units, units[1:]):
        sa, sb = inst.by_rank[a[0]][0].step, inst.by_rank[b[0]][0].step
        per = (sb - sa) if sa is not None and sb is not None and sb > sa else 1
        gaps.append((inst.wall[b[0]] - inst.wall[a[0]]) / per)
    return _median(gaps) / 1e6 if gaps else None


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2.0
