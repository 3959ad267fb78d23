"""One process's memory samples as columns (numpy), read straight from its memory records (pure).

In: a ``ring/memsamples.MemSamples`` (the process's memory records, not yet decoded into
sample dicts). Out: a frozen :class:`MemColumns` - per sample its source, ``what``, phase,
step, thread and wall time; per metric (``rss``, ``cgroup``, ``cuda:N allocated`` ...) a
:class:`Metric` (where the sample has it, its bytes, its limit) - the figures
``ring/memsamples.samples`` would put in each sample dict, decoded by the same rules
(``values``: a figure >= 0; ``limits``: > 0), without a dict per sample. The memory summary
(``colledger.py``, ``summary.analyse_process``) reads these instead of the sample dicts.

:func:`columns` returns None when numpy is missing or a record is not shaped as the ring
decoder writes it (five integers in ``a``, an int or None step): the caller then reads the
sample dicts, which decode anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from operator import itemgetter
from typing import Any, Dict, List, Optional, Sequence, Tuple

from hangtrace.tracer.ring.memsamples import MemSamples, _source

#: source codes in :attr:`MemColumns.src`
OTHER, ENTER, EXIT, OOM = 0, 1, 2, 3
_SRC_CODE = {"phase_enter": ENTER, "phase_exit": EXIT, "oom": OOM}


@dataclass(frozen=True)
class Metric:
    """One metric's column: ``present`` (bool, per sample: it has the figure), ``values``
    (int64 bytes; meaningful where present), ``limits`` (int64 bytes, 0 = no limit), ``pos``
    (its place in a sample's ``values``: rss 0, cgroup 1; allocated 0, reserved 1)."""

    name: str
    present: Any
    values: Any
    limits: Any
    pos: int


@dataclass(frozen=True)
class MemColumns:
    """The samples of one process as columns (see the module docstring). ``n`` samples;
    ``src`` (int8 codes OTHER/ENTER/EXIT/OOM), ``step`` (int64, -1 = None), ``host`` (bool:
    ``what == 'host'``), ``a`` (n x 5 int64: the records' five integers); Python lists
    ``phase``, ``steps`` (None or int), ``thread``; ``records`` (wall times are read from
    them when a ledger row is built: :meth:`t_wall`); ``metrics``: name ->
    :class:`Metric` in the order :func:`analyze.memory.samples._metrics` lists them."""

    n: int
    src: Any
    step: Any
    host: Any
    a: Any
    phase: List[Any]
    steps: List[Any]
    thread: List[Any]
    records: Tuple[Any, ...]
    metrics: Dict[str, Metric]

    def t_wall(self, i: int) -> Any:
        """Sample ``i``'s wall time (ns), as ``samples`` reads it."""
        return self.records[i].get("t_wall_ns") or 0


def columns(ss: Any) -> Optional[MemColumns]:
    """The columns of ``ss`` when it is a :class:`MemSamples` of ring-decoder-shaped
    records and numpy is importable, else None (read the sample dicts)."""
    if not isinstance(ss, MemSamples):
        return None
    try:
        import numpy as np
    except ImportError:
        return None
    recs = ss.records()
    if not recs:
        return None
    try:
        return _columns(np, recs, ss.from_ring)
    except (KeyError, TypeError, ValueError, OverflowError, AttributeError):
        return None


_FIELDS = itemgetter("source", "what", "phase", "step", "thread", "a")


def _fields(recs: Tuple[Any, ...]) -> Tuple[Sequence[Any], ...]:
    """(source, what, phase, step, thread, a) per sample, by the rules of ``samples`` (every
    field read touches 325k objects for 512 ranks: only those the summary reads)."""
    try:  # (the ring decoder's MemorySample: every key present, source and what not empty)
        srcs, whats, phases, steps, threads, raw = zip(*map(_FIELDS, recs))
        if all(srcs) and all(whats) and None not in raw:
            return srcs, whats, phases, steps, threads, raw
    except KeyError:
        pass
    return (
        [r.get("source") or r.get("op") for r in recs],
        [r.get("what") or r.get("group") or "?" for r in recs],
        [r.get("phase") for r in recs],
        [r.get("step") for r in recs],
        [r.get("thread") for r in recs],
        [tuple(r.get("a") or (-1, -1, -1, -1, -1)) for r in recs],
    )


def _ints(raw: Sequence[Any], steps: Sequence[Any], checked: bool) -> bool:
    """The five integers of every record are ints, and every step an int >= 0 or None (the
    ring decoder's records, ``checked``, are: struct-unpacked)."""
    if set(map(len, raw)) != {5}:
        return False
    if checked:
        return True
    return set(map(type, chain.from_iterable(raw))) <= {int} and all(
        x is None or (type(x) is int and x >= 0) for x in steps
    )


def _columns(np: Any, recs: Tuple[Any, ...], checked: bool) -> Optional[MemColumns]:
    n = len(recs)
    srcs, whats, phases, steps, threads, raw = _fields(recs)
    if not _ints(raw, steps, checked):
        return None  # (floats, None or other values among the integers: the sample dicts say it)
    a = np.fromiter(chain.from_iterable(raw), dtype=np.int64, count=5 * n).reshape(n, 5)
    code = {w: i for i, w in enumerate(dict.fromkeys(whats))}
    if not all(type(w) is str for w in code):
        return None
    names = {x: _SRC_CODE.get(_source(x), OTHER) for x in set(srcs)}
    src = np.fromiter(map(names.__getitem__, srcs), dtype=np.int8, count=n)
    if len(code) == 1:
        wcode = np.zeros(n, dtype=np.int64)
    else:
        wcode = np.fromiter(map(code.__getitem__, whats), dtype=np.int64, count=n)
    step = np.array(steps, dtype=float)  # (None: nan)
    if n and np.where(np.isnan(step), 0, step).max() >= 2**53:
        return None  # (a step a float cannot hold exactly)
    return MemColumns(
        n=n,
        src=src,
        step=np.where(np.isnan(step), -1, step).astype(np.int64),
        host=wcode == code.get("host", -1),
        a=a,
        phase=list(phases),
        steps=list(steps),
        thread=list(threads),
        records=recs,
        metrics=_metrics(np, code, wcode, src, a),
    )


def _metrics(np: Any, code: Dict[str, int], wcode: Any, src: Any, a: Any) -> Dict[str, Metric]:
    """Each ``what``'s metrics, by ``samples``' rules; ordered by the first sample that has
    them, then by their place in the sample."""
    found: List[Tuple[int, int, Metric]] = []
    for what, k in code.items():
        w = wcode == k
        if what == "host":
            ms = [
                ("rss", w & (a[:, 0] >= 0), a[:, 0], 0 * a[:, 0], 0),
                ("cgroup", w & (a[:, 2] >= 0), a[:, 2], np.where(a[:, 3] > 0, a[:, 3], 0), 1),
            ]
        elif what.startswith("cuda:"):
            w = w & (src != OOM)
            lim = np.where(a[:, 4] > 0, a[:, 4], 0)
            ms = [
                ("%s allocated" % what, w & (a[:, 0] >= 0), a[:, 0], lim, 0),
                ("%s reserved" % what, w & (a[:, 1] >= 0), a[:, 1], lim, 1),
            ]
        elif what.startswith("gauge:"):
            ms = [(what, w & (a[:, 0] >= 0), a[:, 0], np.where(a[:, 1] > 0, a[:, 1], 0), 0)]
        else:
            ms = []
        for name, present, values, limits, pos in ms:
            if present.any():
                m = Metric(name, present, values, np.where(present, limits, 0), pos)
                found.append((int(np.argmax(present)), pos, m))
    return {m.name: m for _i, _p, m in sorted(found, key=lambda x: (x[0], x[1]))}


def take(xs: List[Any], at: Any) -> List[Any]:
    """``[xs[i] for i in at]`` (``at``: an int array) in one C-level call."""
    if len(at) == 1:
        return [xs[int(at[0])]]
    return list(itemgetter(*at.tolist())(xs)) if len(at) else []


def where(c: MemColumns, i: int) -> Dict[str, Any]:
    """Sample ``i``'s ``{'phase', 'step'}`` (what ``samples._where`` reads)."""
    return {"phase": c.phase[i], "step": c.steps[i]}


def host_level(c: MemColumns) -> Tuple[Optional[int], Optional[str], Optional[int], Optional[int]]:
    """``(i, metric, value, limit)`` of the newest host sample (``samples._last_host`` and
    ``samples._level``): cgroup usage against its limit when both are known, else RSS;
    ``(None, None, None, None)`` without a host sample."""
    hs = c.host.nonzero()[0]
    if not len(hs):
        return None, None, None, None
    i = int(hs[-1])
    rss, _swap, usage, limit, _oom = c.a[i].tolist()
    lim = limit if limit > 0 else (0 if limit == 0 else None)
    if usage >= 0 and lim:
        return i, "cgroup", usage, lim
    return i, "rss", rss if rss >= 0 else None, lim or None


def peak(c: MemColumns, metric: str) -> Optional[Tuple[int, int]]:
    """``(bytes, i)``: the highest figure of ``metric`` and the first sample with it
    (``samples._peak``), or None when no sample has it."""
    m = c.metrics.get(metric)
    if m is None:
        return None
    at = m.present.nonzero()[0]
    i = int(at[int(m.values[at].argmax())])
    return int(m.values[i]), i
