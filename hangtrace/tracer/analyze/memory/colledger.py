"""The memory ledger, kept-across flags and trends of one process from its sample columns (pure).

In: a ``columns.MemColumns``. Out: the same results as ``ledger.ledger``, ``ledger.kept_across``
and ``trend.trend`` give on the process's sample dicts (the rules are in those modules'
docstrings; ``tests/unit/test_memory_columns.py`` compares both on real and synthetic rings),
computed without a dict per sample or per ledger row:

* :func:`ledger_rows`: the ledger as columns per metric (:class:`MetricRows`: the sample
  index where each row was entered, left (-1: still open) and last measured, its depth).
  The phase stacks are walked once per distinct set of samples carrying a metric (rss and
  the cgroup usage share one walk); the bytes are then read by index.
  :class:`LedgerRows` builds the row dicts only when read (a report's few ranks).
* :func:`kept_flags`: the per-step test that decides whether a flag is possible runs on the
  columns; only a metric that passes it is judged by ``ledger.kept_flag`` on its row dicts.
* :func:`trends`: each step's first sample, the limit and the newest figure found by numpy;
  the arithmetic is ``trend.trend_of``'s, the same floats in the same order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from hangtrace.tracer.analyze.memory.columns import (
    ENTER,
    EXIT,
    OOM,
    MemColumns,
    Metric,
    host_level,
    peak,
    take,
    where,
)
from hangtrace.tracer.analyze.memory.ledger import kept_flag, kept_threshold
from hangtrace.tracer.analyze.memory.samples import _primary, _thr
from hangtrace.tracer.analyze.memory.trend import trend_of


@dataclass(frozen=True)
class MetricRows:
    """One metric's ledger rows, in row order: sample indices ``enter``, ``exit`` (-1: the
    phase did not end), ``last`` (the newest sample measured in it) and ``depth`` (int64
    arrays)."""

    metric: Metric
    enter: Any
    exit: Any
    last: Any
    depth: Any


def _walk(c: MemColumns, present: Any) -> Tuple[List[int], List[int], List[int], List[int]]:
    """``ledger.ledger``'s stack walk over the samples that carry a metric (mask ``present``):
    per row, the sample indices (enter, exit or -1, last) and its depth."""
    enter: List[int] = []
    exit_: List[int] = []
    last: List[int] = []
    depth: List[int] = []
    stacks: Dict[Any, List[Tuple[int, Any]]] = {}  # thread -> [(row, phase), ...] open phases
    src, phase, thread = c.src, c.phase, c.thread
    for i in present.nonzero()[0].tolist():
        k = src[i]
        if k != ENTER and k != EXIT:  # timer/step/oom: the newest value inside the open phases
            for st in stacks.values():
                if st:
                    last[st[-1][0]] = i
            continue
        st = stacks.setdefault(thread[i], [])
        if k == ENTER:
            st.append((len(enter), phase[i]))
            enter.append(i)
            exit_.append(-1)
            last.append(i)
            depth.append(len(st) - 1)
            continue
        ph = phase[i]
        for j in range(len(st) - 1, -1, -1):
            if st[j][1] == ph:
                row = st[j][0]
                exit_[row] = last[row] = i
                del st[j:]
                break
    return enter, exit_, last, depth


def _pairs(np: Any, c: MemColumns, present: Any) -> Optional[Tuple[Any, ...]]:
    """:func:`_walk`'s result when every phase sample carrying the metric is on one thread and
    they alternate enter / exit of the same phase (no nesting: each row ends at the next
    phase sample; a last one entered and not left takes the newest sample as ``last``),
    computed by numpy; None otherwise (walk)."""
    at = present.nonzero()[0]
    k = c.src[at]
    ph = at[(k == ENTER) | (k == EXIT)]
    if not len(ph):
        return tuple(np.zeros(0, dtype=np.int64) for _ in range(4))
    k = c.src[ph]
    if (k[0::2] != ENTER).any() or (k[1::2] != EXIT).any():
        return None
    names, threads = take(c.phase, ph), take(c.thread, ph)
    if threads.count(threads[0]) != len(threads) or names[1::2] != names[0::2][: len(names) // 2]:
        return None
    enter = ph[0::2]
    exit_ = np.full(len(enter), -1, dtype=np.int64)
    exit_[: len(ph) // 2] = ph[1::2]
    last = exit_.copy()
    if len(ph) % 2:
        last[-1] = at[-1]
    return enter, exit_, last, np.zeros(len(enter), dtype=np.int64)


def ledger_rows(np: Any, c: MemColumns) -> List[MetricRows]:
    """The ledger of ``c`` per metric (metrics in sample order, see ``MemColumns.metrics``)."""
    walks: Dict[bytes, Tuple[Any, ...]] = {}
    out = []
    for m in c.metrics.values():
        key = m.present.tobytes()
        if key not in walks:
            walks[key] = _pairs(np, c, m.present) or tuple(
                np.array(x, dtype=np.int64) for x in _walk(c, m.present)
            )
        e, x, last, depth = walks[key]
        if len(e):
            out.append(MetricRows(m, e, x, last, depth))
    return out


def _row_dicts(c: MemColumns, r: MetricRows, rank: Optional[int]) -> List[Dict[str, Any]]:
    """One metric's ledger rows as ``ledger.ledger``'s dicts."""
    v, lim = r.metric.values.tolist(), r.metric.limits.tolist()
    out = []
    for e, x, last, depth in zip(r.enter.tolist(), r.exit.tolist(), r.last.tolist(), r.depth.tolist()):
        limit = lim[x] if x >= 0 and lim[x] else (lim[e] or None)
        out.append(
            {
                "rank": rank,
                "step": c.steps[e],
                "phase": c.phase[e],
                "metric": r.metric.name,
                "enter": v[e],
                "exit": v[x] if x >= 0 else None,
                "delta": v[x] - v[e] if x >= 0 else None,
                "last": v[last],
                "depth": depth,
                "t_enter_ns": c.t_wall(e),
                "limit": limit,
            }
        )
    return out


def _row_order(rows: List[MetricRows]) -> List[Tuple[int, int, int, int]]:
    """(enter sample, place in the sample, metric, row) of every row, in ``ledger``'s order."""
    keys = []
    for k, r in enumerate(rows):
        keys += [(e, r.metric.pos, k, j) for j, e in enumerate(r.enter.tolist())]
    return sorted(keys)


class LedgerRows(Sequence[Dict[str, Any]]):
    """The ledger rows of one process (``ledger.ledger``'s list), built when first read."""

    __slots__ = ("_c", "_rows", "_rank", "_list")

    def __init__(self, c: MemColumns, rows: List[MetricRows], rank: Optional[int]) -> None:
        self._c, self._rows, self._rank = c, rows, rank
        self._list: Optional[List[Dict[str, Any]]] = None

    def _built(self) -> List[Dict[str, Any]]:
        if self._list is None:
            per = [_row_dicts(self._c, r, self._rank) for r in self._rows]
            self._list = [per[k][j] for _e, _p, k, j in _row_order(self._rows)]
        return self._list

    def __len__(self) -> int:
        return sum(len(r.enter) for r in self._rows)

    def __getitem__(self, i: Any) -> Any:
        return self._built()[i]

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        return iter(self._built())


def _may_flag(np: Any, c: MemColumns, r: MetricRows) -> bool:
    """Whether ``ledger.kept_flag`` can flag this metric: of the finished steps
    ``ledger._net_per_step`` counts, one kept more than the threshold and one released."""
    v, name = r.metric.values, r.metric.name
    closed = r.exit >= 0
    peak = int(max(np.abs(v[r.enter]).max(), np.abs(v[r.exit[closed]]).max() if closed.any() else 0))
    thr = kept_threshold(name, _thr([peak]))
    top = r.depth == 0
    steps = c.step[r.enter[top]]
    known = steps >= 0
    steps, enter, exit_ = steps[known], r.enter[top][known], r.exit[top][known]
    if not len(steps):
        return False
    order, first = np.unique(steps, return_index=True)  # (a step's first and last rows)
    last = len(steps) - 1 - np.unique(steps[::-1], return_index=True)[1]
    ok = exit_[last] >= 0  # (a step not finished: died in it)
    if len(order) > 2:
        ok[-1] = False  # the newest step may be cut short by a failure
        ok[0] = ok[0] and name not in ("rss", "cgroup")  # host memory warms up in the first
    net = v[exit_[last][ok]] - v[enter[first][ok]]
    return bool((net > thr).any() and (np.abs(net) <= thr).any())


def kept_flags(np: Any, c: MemColumns, rows: List[MetricRows], rank: Optional[int]) -> List[Dict[str, Any]]:
    """``ledger.kept_across`` of the process's ledger (metrics in the order of their first row)."""
    flags = []
    for r in sorted(rows, key=lambda r: (int(r.enter[0]), r.metric.pos)):
        if r.metric.name == "cgroup" or not _may_flag(np, c, r):
            continue  # (cgroup: shared by the ranks of a container, see ledger.kept_across)
        f = kept_flag(r.metric.name, _row_dicts(c, r, rank), rank)
        if f is not None:
            flags.append(f)
    return flags


def _series(np: Any, c: MemColumns, m: Metric) -> List[Tuple[int, int, Optional[int]]]:
    """``trend._series``: [(step, bytes, limit or None)], the first sample of each step."""
    at = (m.present & (c.step >= 0) & (c.src != OOM)).nonzero()[0]
    steps, first = np.unique(c.step[at], return_index=True)
    at = at[first]
    return [
        (st, v, lim or None)
        for st, v, lim in zip(steps.tolist(), m.values[at].tolist(), m.limits[at].tolist())
    ]


def _limit(c: MemColumns, m: Metric) -> Tuple[Optional[int], Optional[int]]:
    """``trend._limit``: (limit, headroom_base) from the newest sample that has one."""
    own = m.limits > 0
    cg = c.metrics.get("cgroup") if m.name == "rss" else None
    shared = (cg.present & (cg.limits > 0)) if cg is not None else own & False
    at = (own | shared).nonzero()[0]
    if not len(at):
        return None, None
    i = int(at[-1])
    if own[i]:
        return int(m.limits[i]), None
    assert cg is not None
    return int(cg.limits[i]), int(cg.values[i])


def _per_phase(np: Any, c: MemColumns, r: Optional[MetricRows]) -> Dict[Any, List[int]]:
    """The deltas of a metric's finished top-level rows per phase (phases in row order)."""
    if r is None:
        return {}
    done = (r.exit >= 0) & (r.depth == 0)
    if not done.any():
        return {}
    v = r.metric.values
    deltas = v[r.exit[done]] - v[r.enter[done]]
    names = take(c.phase, r.enter[done])
    code = {p: k for k, p in enumerate(dict.fromkeys(names))}
    if len(code) == 1:
        return {names[0]: deltas.tolist()}
    codes = np.fromiter(map(code.__getitem__, names), dtype=np.int64, count=len(names))
    return {p: deltas[codes == k].tolist() for p, k in code.items()}


def trends(np: Any, c: MemColumns, rows: List[MetricRows]) -> Dict[str, Dict[str, Any]]:
    """``summary.analyse_process``'s trends: ``trend.trend`` of every primary metric that
    has 3 steps or more, in ``samples._metrics`` order."""
    by_name = {r.metric.name: r for r in rows}
    out = {}
    for name, m in c.metrics.items():
        if not _primary([], name):
            continue
        ser = _series(np, c, m)
        if len(ser) < 3:
            continue
        limit, base = _limit(c, m)
        newest = int(m.values[int(m.present.nonzero()[0][-1])])
        out[name] = trend_of(name, ser, _per_phase(np, c, by_name.get(name)), limit, base, newest)
    return out


def figures(c: MemColumns) -> Tuple[Optional[str], Optional[int], Optional[int], Any]:
    """``(metric, last, limit, peak)`` of ``summary._rank_figures``: the newest host
    sample's level (``columns.host_level``) and the peak of that metric as ``(bytes,
    {'phase', 'step'})`` or None."""
    i, metric, val, lim = host_level(c)
    pk = peak(c, metric) if metric else None
    return metric, val, lim, (pk[0], where(c, pk[1])) if pk else None


def analyse_columns(c: MemColumns, rank: Optional[int]) -> Dict[str, Any]:
    """``summary.analyse_process``'s result from the columns: ``rows`` (:class:`LedgerRows`),
    ``kept``, ``trends``, ``figures`` (:func:`figures`)."""
    import numpy as np

    mrows = ledger_rows(np, c)
    return {
        "rows": LedgerRows(c, mrows, rank),
        "kept": kept_flags(np, c, mrows, rank),
        "trends": trends(np, c, mrows),
        "figures": figures(c),
    }
