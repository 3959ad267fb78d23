"""Flight Recorder entries parsed: torch's entry dicts in, ``FrEntry`` out. Pure.

In: the ``entries`` list of a decoded dump (``collect/frdump.py``: pickle or JSON). Out: a
tuple of ``ring/frentries.FrEntry``. Field names and meanings: torch's
``FlightRecorder.hpp`` (torch 2.13). Malformed field values become defaults (0, -1, '', None).
"""

from __future__ import annotations

import marshal
import re
from typing import Any, Callable, Dict, List, Optional, Tuple

from hangtrace.tracer.ring.frentries import FrEntry, FrFrame

_P2P_RE = re.compile(r"^(\w+) (\d+)(->|<-)(\d+)$")


def as_int(v: Any, default: int = 0) -> int:
    """``int(v)``, ``default`` when ``v`` is not a number."""
    if type(v) is int:
        return v
    if v is None:  # torch's undiscovered times: an exception each was 1/10 of the analysis
        return default
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


def _opt_int(v: Any) -> Optional[int]:
    """None for None and for 0 (JSON writes 0 for 'not discovered')."""
    i = as_int(v, 0)
    return i or None


def _sizes(v: Any) -> Tuple[Tuple[int, ...], ...]:
    if not isinstance(v, (list, tuple)):
        return ()
    return tuple(tuple(as_int(d) for d in s) if isinstance(s, (list, tuple)) else (as_int(s),) for s in v)


def _strs(v: Any) -> Tuple[str, ...]:
    return tuple(str(x) for x in v) if isinstance(v, (list, tuple)) else ()


def split_profiling_name(name: str) -> Tuple[str, str, Optional[int], Optional[int]]:
    """``(backend, op, self_local, peer_local)`` of a ``profiling_name``.

    ``gloo:all_reduce`` -> ('gloo', 'all_reduce', None, None); ``nccl:send 1->2`` ->
    ('nccl', 'send', 1, 2); ``nccl:recv 3<-0`` -> ('nccl', 'recv', 3, 0). A name without a
    ``backend:`` prefix gets backend ''.
    """
    backend, sep, rest = name.partition(":")
    if not sep:
        backend, rest = "", name
    m = _P2P_RE.match(rest.strip())
    if m:
        return backend, m.group(1), int(m.group(2)), int(m.group(4))
    return backend, rest.strip(), None, None


def _frames(v: Any) -> Tuple[FrFrame, ...]:
    return tuple(
        FrFrame(str(f.get("name", "")), str(f.get("filename", "")), as_int(f.get("line")))
        for f in (v or ())
        if isinstance(f, dict)
    )


#: an entry's fields that the entries of one shape share (one op on one group from one
#: thread: every step's collectives); the others (ids, seq, times) vary per entry
_SHAPE_KEYS = (
    "process_group",
    "profiling_name",
    "pg_id",
    "input_sizes",
    "input_dtypes",
    "output_sizes",
    "output_dtypes",
    "state",
    "retired",
    "timeout_ms",
    "thread_name",
    "thread_id",
    "is_p2p",
    "frames",
)


#: the fields of an entry that vary within a shape: ints, and times that may be unknown
_VARYING_INTS = ("record_id", "collective_seq_id", "p2p_seq_id", "op_id", "time_created_ns")
_VARYING_OPT_INTS = ("time_discovered_started_ns", "time_discovered_completed_ns")


def _shape_key(d: Dict[str, Any]) -> Any:
    """What ``_entry`` reads of ``d``'s shared fields (``_SHAPE_KEYS``, and whether
    ``is_p2p`` is there at all: missing, it follows the name; None, it is False) as one
    hashable value: their ``marshal`` bytes (exact: ints, floats, bools, strings, lists and
    tuples each marshal as their own type), else, for a value marshal refuses, their repr.
    One shape's entries marshal alike (issue 40: the repr of each entry's fields was half
    the cost of parsing a dump)."""
    v = [*map(d.get, _SHAPE_KEYS), "is_p2p" in d]
    try:
        return marshal.dumps(v, 2)
    except ValueError:
        return repr(v)


def parse_entries(raw: List[Any]) -> Tuple[FrEntry, ...]:
    """``_entry`` of each dict of ``raw`` (others skipped), each distinct shape
    (``_shape_key``) parsed once: a later entry of that shape is the first
    one's ``FrEntry`` with its own ids, seq numbers and times (issue 40: parsing ~600
    entries a dump field by field was the largest cost of analysing 4,096 ranks)."""
    shapes: Dict[Any, FrEntry] = {}
    cache: Dict[Any, Any] = {}
    out = []
    new = object.__new__
    for d in raw:
        if not isinstance(d, dict):
            continue
        g = d.get
        k = _shape_key(d)
        t = shapes.get(k)
        if t is None:
            t = shapes[k] = _entry(d, cache)
            out.append(t)
            continue
        f = t.__dict__.copy()
        for n in _VARYING_INTS:
            v = g(n)
            f[n] = v if type(v) is int else as_int(v)
        for n in _VARYING_OPT_INTS:
            v = g(n)
            f[n] = (v or None) if type(v) is int else _opt_int(v)
        dur = g("duration_ms")
        f["duration_ms"] = float(dur) if isinstance(dur, (int, float)) else None
        # a frozen dataclass: its fields set as its own __init__ sets them (object.__setattr__)
        e = new(FrEntry)
        object.__setattr__(e, "__dict__", f)
        out.append(e)
    return tuple(out)


def select_raw(raw: List[Any], cutoff_ns: int) -> List[Dict[str, Any]]:
    """The entry dicts of ``raw`` (torch's, unparsed) that a join with a ring window starting
    at ``cutoff_ns`` (wall ns, ``ring/frjoin.window_cutoff``) can use, in their order. Kept: every entry launched at or
    after the cutoff; before it, per group and ``profiling_name``, the newest entry and the
    one with the highest ``collective_seq_id`` (what ``frrecords.merge_records`` reads of
    the entries before a window: a group's newest, the seq before a call), and every failed
    entry (``frrecords.fr_state``: retired before completion, not gloo). Parsing only these
    is issue 40's saving: of a real DDP rank's 612 entries, 84 reached its merged records.
    Every group of the dump keeps an entry (its newest)."""
    keep: List[bool] = []
    newest: Dict[Tuple[Any, Any], int] = {}
    top: Dict[Tuple[Any, Any], Tuple[int, int]] = {}
    for i, d in enumerate(raw):
        if not isinstance(d, dict):
            keep.append(False)
            continue
        g = d.get
        t = g("time_created_ns")
        if (t if type(t) is int else as_int(t)) >= cutoff_ns:
            keep.append(True)
            continue
        pg = g("process_group") or ("", "")
        name = str(g("profiling_name") or "")
        state = str(g("state") or "")
        backend = name.partition(":")[0] if ":" in name else ""
        keep.append(state != "completed" and backend != "gloo" and bool(g("retired", False)))
        key = (str(pg[0]) if pg else "", name)
        newest[key] = i
        seq = as_int(g("collective_seq_id"))
        if key not in top or seq > top[key][0]:
            top[key] = (seq, i)
    for i in [*newest.values(), *(i for _, i in top.values())]:
        keep[i] = True
    return [d for d, k in zip(raw, keep) if k]


def _memo(cache: Dict[Any, Any], fn: Callable[[Any], Any], v: Any) -> Any:
    """``fn(v)`` through ``cache``, keyed by ``v``'s repr (one dump repeats the same stacks,
    sizes, dtypes and names entry after entry: every step's collectives)."""
    k = (fn, repr(v))
    got = cache.get(k)
    if got is None:
        got = cache[k] = fn(v)
    return got


def _entry(d: Dict[str, Any], cache: Optional[Dict[Any, Any]] = None) -> FrEntry:
    c: Dict[Any, Any] = {} if cache is None else cache
    pg = d.get("process_group") or ("", "")
    pg = list(pg) + ["", ""]
    backend, op, me, peer = _memo(c, split_profiling_name, str(d.get("profiling_name") or ""))
    frames = _memo(c, _frames, d.get("frames"))
    dur = d.get("duration_ms")
    return FrEntry(
        record_id=as_int(d.get("record_id")),
        pg_id=as_int(d.get("pg_id"), -1),
        group=str(pg[0]),
        group_desc=str(pg[1]),
        collective_seq_id=as_int(d.get("collective_seq_id")),
        p2p_seq_id=as_int(d.get("p2p_seq_id")),
        op_id=as_int(d.get("op_id")),
        profiling_name=str(d.get("profiling_name") or ""),
        backend=backend,
        op=op,
        self_local=me,
        peer_local=peer,
        is_p2p=bool(d.get("is_p2p", peer is not None)),
        input_sizes=_memo(c, _sizes, d.get("input_sizes")),
        input_dtypes=_memo(c, _strs, d.get("input_dtypes")),
        output_sizes=_memo(c, _sizes, d.get("output_sizes")),
        output_dtypes=_memo(c, _strs, d.get("output_dtypes")),
        state=str(d.get("state") or ""),
        retired=bool(d.get("retired", False)),
        timeout_ms=as_int(d.get("timeout_ms")),
        time_created_ns=as_int(d.get("time_created_ns")),
        time_discovered_started_ns=_opt_int(d.get("time_discovered_started_ns")),
        time_discovered_completed_ns=_opt_int(d.get("time_discovered_completed_ns")),
        duration_ms=float(dur) if isinstance(dur, (int, float)) else None,
        thread_name=str(d.get("thread_name") or ""),
        thread_id=str(d.get("thread_id") or ""),
        frames=frames,
    )
