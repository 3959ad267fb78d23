"""Memory samples decoded from the ring's memory records (``K_MEM``, ``hooks/mem/memory.py``
writes them; docs/MEMORY.md): one dict per sample, in record order. Pure; part of the file
contract, so that collection (``collect/ringprocs``) and analysis (``analyze/memory``) both
read samples from here.

Sample dicts::

    {"t_wall_ns", "source": 'timer'|'phase_enter'|'phase_exit'|'step'|'oom',
     "what": 'host'|'cuda:N'|'gauge:<name>', "phase", "step", "thread",
     "values": {metric: bytes}, "limits": {metric: bytes}, "oom_kills": int|None,
     "swap": int|None, "raw": the record's five integers}

:class:`MemSamples` is the same list decoded on first access: collection wraps every
process's memory records in one (``collect/ringprocs``) and the memory summary reads their
columns instead (``analyze/memory/columns.py``), so no sample dict is built for a process
whose samples only the summary reads.

Metrics: ``rss`` and ``cgroup`` (usage, limited by the cgroup limit) from 'host';
``cuda:N allocated`` / ``cuda:N reserved`` (limit: device total); ``gauge:<name>``
(limit: the registered budget). Bytes are ints; times are ns since the Unix epoch.
"""

from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, overload

from hangtrace.tracer.ring import layout as F

#: one memory sample (see the module docstring)
Sample = Dict[str, Any]

_SRC = {i: n for i, n in enumerate(F.MEM_SOURCES)}


def known(x: Optional[float]) -> Optional[int]:
    """A recorded figure, or None for the ring's "not known" (a negative value)."""
    return None if x is None or x < 0 else int(x)


_SOURCE_OF: Dict[Tuple[type, Any], str] = {}


def _source(op: Any) -> str:
    """The source name of a memory record's ``source``/``op`` value, remembered per value
    (the names fail ``int()``: an exception per sample was a twentieth of the analysis)."""
    k = (type(op), op)
    try:
        return _SOURCE_OF[k]
    except (KeyError, TypeError):
        pass
    got = _source_of(op)
    if len(_SOURCE_OF) < 1024:
        try:
            _SOURCE_OF[k] = got
        except TypeError:
            pass
    return got


def _source_of(op: Any) -> str:
    if isinstance(op, int):
        return _SRC.get(op, str(op))
    i = F.OP_IDS.get(op)
    if i is None:
        try:
            i = int(op)
        except (TypeError, ValueError):
            return str(op)
    return _SRC.get(i, str(op))


def samples(records: Optional[List[Any]]) -> List[Sample]:
    """Memory samples (dicts, see module doc) of a record list, in record order."""
    out = []
    for r in records or ():
        if r.get("kind") != "memory":
            continue
        a = tuple(r.get("a") or (-1, -1, -1, -1, -1))
        what = r.get("what") or r.get("group") or "?"  # MemorySample; older dicts: group/op
        src = _source(r.get("source") or r.get("op"))
        s = {
            "t_wall_ns": r.get("t_wall_ns") or 0,
            "source": src,
            "what": what,
            "phase": r.get("phase"),
            "step": r.get("step"),
            "thread": r.get("thread"),
            "values": {},
            "limits": {},
            "oom_kills": None,
            "swap": None,
            "raw": a,
        }
        if what == "host":
            rss, swap, usage, limit, oom = a
            if known(rss) is not None:
                s["values"]["rss"] = rss
            if known(usage) is not None:
                s["values"]["cgroup"] = usage
                if limit and limit > 0:
                    s["limits"]["cgroup"] = limit
            s["swap"], s["oom_kills"] = known(swap), known(oom)
            s["limit"] = limit if limit and limit > 0 else (0 if limit == 0 else None)
        elif what.startswith("cuda:"):
            if src == "oom":
                s["requested"], s["device_allocated"], s["device_free"] = (
                    known(a[0]),
                    known(a[1]),
                    known(a[3]),
                )
                s["device_total"] = known(a[4])
            else:
                for name, x in (("allocated", a[0]), ("reserved", a[1])):
                    if known(x) is not None:
                        s["values"]["%s %s" % (what, name)] = x
                        if a[4] and a[4] > 0:
                            s["limits"]["%s %s" % (what, name)] = a[4]
                s["peak"], s["device_free"], s["device_total"] = known(a[2]), known(a[3]), known(a[4])
        elif what.startswith("gauge:"):
            if known(a[0]) is not None:
                s["values"][what] = a[0]
                if a[1] and a[1] > 0:
                    s["limits"][what] = a[1]
        out.append(s)
    return out


class MemSamples(Sequence[Sample]):
    """The memory samples (:func:`samples`) of a process's ``records`` (its ring summary's
    memory records), decoded into sample dicts on first access and kept; the records
    themselves stay readable (:meth:`records`: the ``kind == 'memory'`` ones, in order) for
    readers of columns. ``len`` is the number of memory records (once decoded: of
    samples). Compares
    equal to any sequence of the same sample dicts. ``from_ring``: the records are the
    ring decoder's memory records (``ring/records.decode``: five struct-unpacked ints in
    ``a``, a step >= 0 or None; ``RingSummary.memory`` holds no other kind), which readers
    of columns need not check again."""

    __slots__ = ("_source_records", "_records", "_decoded", "from_ring")

    def __init__(self, records: Optional[Sequence[Any]], from_ring: bool = False) -> None:
        self._source_records = records or ()
        self.from_ring = from_ring
        self._records: Optional[Tuple[Any, ...]] = None
        self._decoded: Optional[List[Sample]] = None

    def records(self) -> Tuple[Any, ...]:
        """The memory records (dicts of ``ring/records.py``), in record order."""
        if self._records is None:  # (a ring summary's memory records are all of kind 'memory')
            src = self._source_records
            self._records = (
                tuple(src) if self.from_ring else tuple([r for r in src if r.get("kind") == "memory"])
            )
        return self._records

    def decoded(self) -> List[Sample]:
        """The sample dicts, decoded once. A record :func:`samples` cannot decode raises,
        except in records from a ring (``from_ring``), which then give [] (as collection
        always did)."""
        if self._decoded is None:
            try:
                self._decoded = samples(list(self.records()))
            except Exception:
                if not self.from_ring:
                    raise
                self._decoded = []
        return self._decoded

    def __len__(self) -> int:
        return len(self._decoded) if self._decoded is not None else len(self.records())

    @overload
    def __getitem__(self, i: int) -> Sample: ...

    @overload
    def __getitem__(self, i: slice) -> List[Sample]: ...

    def __getitem__(self, i: Any) -> Any:
        return self.decoded()[i]

    def __iter__(self) -> Iterator[Sample]:
        return iter(self.decoded())

    def __reversed__(self) -> Iterator[Sample]:
        return reversed(self.decoded())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return list(other) == self.decoded()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return "MemSamples(%d records)" % len(self)
