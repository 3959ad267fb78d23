"""The ring summary straight from a ring's slot array: one vectorised numpy pass. Pure.

In: the raw slot bytes of a ring (``nslots * layout.SLOT_SIZE``), its string table and the
header's in-flight index. Out: the ``summary.RingSummary`` that ``summary.summarize_records``
computes from every decoded record (the selection rules are in ``ring/summary.py``'s
docstring), decoding only the records it keeps; the tail stays raw slots
(:class:`LazyRecords`, decoded on access). Without numpy, :func:`summarize_slots` decodes
every slot (``records.decode_slots``) and uses ``summarize_records``.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, Mapping, Optional, Sequence, Tuple

from hangtrace.tracer.ring.layout import (
    K_COLL,
    K_GROUP,
    K_MEM,
    K_P2P,
    K_PHASE_ENTER,
    K_PHASE_EXIT,
    K_STEP,
    K_WAIT,
    S_FAILED,
    SLOT,
    SLOT_SIZE,
)
from hangtrace.tracer.ring.records import Record, decode, decode_slots
from hangtrace.tracer.ring.slotcolumns import decode_raw, decode_rows, slot_dtype
from hangtrace.tracer.ring.summary import (
    HISTORY,
    TAIL,
    AnyRecord,
    RingSummary,
    blocked_in,
    failed_phases_of,
    phase_visits_of,
    summarize_records,
    wait_key,
)

_PROGRESS_IDS = (K_COLL, K_P2P, K_STEP, K_PHASE_ENTER, K_PHASE_EXIT, K_GROUP)
_HISTORY_IDS = (K_COLL, K_PHASE_ENTER, K_PHASE_EXIT, K_STEP)


#: iterating at least this many records decodes them as columns (``slotcolumns``)
_BULK = 16


class LazyRecords(Sequence[AnyRecord]):
    """Records kept as their raw slots (128 bytes each) and decoded on access: the tail of
    4,096 rings costs 32 MiB of bytes instead of ~400 MiB of dicts. Compares equal to any
    sequence of the same decoded records."""

    __slots__ = ("_raw", "_strings")

    def __init__(self, raw: bytes, strings: Mapping[int, str]) -> None:
        self._raw = raw
        self._strings = strings

    def __len__(self) -> int:
        return len(self._raw) // SLOT_SIZE

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(i)
        return decode(SLOT.unpack_from(self._raw, i * SLOT_SIZE), self._strings)

    def __iter__(self) -> Iterator[AnyRecord]:
        if len(self) >= _BULK:  # (the Flight Recorder join reads a rank's 512-record history whole)
            try:
                import numpy as np

                return iter(decode_raw(np, self._raw[: len(self) * SLOT_SIZE], self._strings))
            except ImportError:
                pass
        return (
            decode(t, self._strings) for t in SLOT.iter_unpack(memoryview(self._raw)[: len(self) * SLOT_SIZE])
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(other) == len(self) and all(a == b for a, b in zip(self, other))

    def __hash__(self) -> int:
        return hash(self._raw)

    def __repr__(self) -> str:
        return "LazyRecords(%d records)" % len(self)


def summarize_slots(
    slots: bytes,
    nslots: int,
    strings: Dict[int, str],
    inflight_idx: int = 0,
    tail: int = TAIL,
    use_numpy: Optional[bool] = None,
) -> RingSummary:
    """The summary of a ring's slot array (``nslots * SLOT_SIZE`` bytes, or its first part:
    the slots after it never written).

    ``use_numpy``: None = numpy when importable, True = numpy (ImportError without it),
    False = decode every slot and use :func:`summarize_records`. Same result either way.
    """
    if use_numpy is not False:
        try:
            import numpy as np

            del np
        except ImportError:
            if use_numpy:
                raise
            use_numpy = False
    if use_numpy is False:
        return summarize_records(decode_slots(slots, nslots, strings), inflight_idx, tail)
    return _summarize_np(slots, nslots, strings, inflight_idx, tail)


_LUT: Any = None


def _progress_lut(np: Any) -> Any:
    """Boolean lookup table: record kind id -> is a progress kind."""
    global _LUT
    if _LUT is None:
        _LUT = np.zeros(256, dtype=bool)
        _LUT[list(_PROGRESS_IDS)] = True
    return _LUT


def _last_per_key(np: Any, pos: Any, keys: Sequence[Any]) -> Any:
    """Of the slot positions ``pos`` (index order), the last one per distinct key tuple
    after sorting by ``keys`` (lexsort: the last key is primary)."""
    if not len(pos):
        return pos
    o = np.lexsort(keys)
    primary = [k[o] for k in keys[2:]]  # keys[0] = idx, keys[1] = seq: not part of the group key
    end = np.zeros(len(o), dtype=bool)
    end[-1] = True
    for k in primary:
        end[:-1] |= k[1:] != k[:-1]
    return pos[o[end]]


def _summarize_np(
    slots: bytes, nslots: int, strings: Dict[int, str], inflight_idx: int, tail: int
) -> RingSummary:
    import numpy as np

    n = min(nslots, len(slots) // SLOT_SIZE)  # (a ring read up to its first hole: fewer)
    arr = np.frombuffer(slots, dtype=slot_dtype(np), count=n)
    idx = arr["idx"].astype(np.int64)
    valid = (idx > 0) & ((idx - 1) % nslots == np.arange(n, dtype=np.int64))
    pos = np.flatnonzero(valid)
    if not len(pos):
        return RingSummary()
    pos = pos[np.argsort(idx[pos], kind="stable")]
    pos = pos[idx[pos] > idx[pos[-1]] - nslots]  # newest window only (torn leftovers dropped)
    kind = arr["kind"][pos]
    state = arr["state"][pos]
    mpos = pos[kind == K_MEM]
    memory = tuple(decode_rows(arr[mpos], strings))  # (half of a rank ring's records: as columns)
    cache: Dict[int, Record] = dict(zip(mpos.tolist(), memory))

    def rec(p: int) -> Record:
        r = cache.get(p)
        if r is None:
            r = cache[p] = decode(SLOT.unpack_from(slots, p * SLOT_SIZE), strings)
        return r

    comm = (kind == K_COLL) | (kind == K_P2P)
    cpos = pos[comm]
    last_comm = rec(int(cpos[-1])) if len(cpos) else None
    failed = pos[comm & (state == S_FAILED)]
    first_failed = rec(int(failed[0])) if len(failed) else None
    prog = pos[_progress_lut(np)[kind]]
    last_progress = None
    if len(prog):
        tw = arr["t_wall"][prog]
        last_progress = rec(int(prog[np.flatnonzero(tw == tw.max())[-1]]))
    by_group: Dict[Optional[str], Record] = {}
    gpos = pos[kind == K_COLL]
    for p in _last_per_key(np, gpos, (idx[gpos], arr["seq"][gpos], arr["group"][gpos])).tolist():
        _keep_max(by_group, rec(p).get("group"), rec(p))
    by_peer: Dict[Tuple[Optional[str], int], Record] = {}
    ppos = pos[kind == K_P2P]
    for p in _last_per_key(
        np, ppos, (idx[ppos], arr["seq"][ppos], arr["peer"][ppos], arr["group"][ppos])
    ).tolist():
        r = rec(p)
        _keep_max(by_peer, (r.get("group"), r.get("peer")), r)
    exits: Dict[str, Record] = {}
    enters: Dict[str, Record] = {}
    for k, into in ((K_PHASE_EXIT, exits), (K_PHASE_ENTER, enters)):
        xpos = pos[(kind == k) & (arr["phase"][pos] != 0)]
        for p in _last_per_key(np, xpos, (idx[xpos], idx[xpos], arr["phase"][xpos])).tolist():
            r = rec(p)
            name = r.get("phase")
            if name:
                into[str(name)] = r
    waits: Dict[Optional[str], Record] = {}
    wpos = pos[kind == K_WAIT]
    for p in _last_per_key(
        np, wpos, (idx[wpos], idx[wpos], arr["numel"][wpos], arr["thread"][wpos])
    ).tolist():
        r = rec(p)
        wk = wait_key(r)
        if wk is None and r.get("numel"):
            continue  # a completed await
        cur = waits.get(wk)
        if cur is None or r["idx"] > cur["idx"]:
            waits[wk] = r
    inflight = None
    if inflight_idx:
        ip = (inflight_idx - 1) % nslots
        if ip < n and valid[ip] and idx[ip] == inflight_idx and idx[ip] > idx[pos[-1]] - nslots:
            r = rec(ip)
            if r.get("state") == "issued":
                inflight = r
    return RingSummary(
        count=len(pos),
        last=rec(int(pos[-1])),
        last_comm=last_comm,
        first_failed=first_failed,
        last_progress=last_progress,
        inflight=blocked_in(inflight, last_comm),
        by_group=by_group,
        by_peer=by_peer,
        tail=_raw(np, slots, n, pos[-tail:], strings) if tail else (),
        memory=memory,
        failed_phases=failed_phases_of(exits),
        waits=waits,
        phase_visits=phase_visits_of(enters, exits),
        history=_raw(np, slots, n, pos[np.isin(kind, _HISTORY_IDS)][-HISTORY:], strings),
    )


def _raw(np: Any, slots: bytes, n: int, keep: Any, strings: Dict[int, str]) -> "LazyRecords":
    """The slots at positions ``keep`` of the ``n`` in ``slots`` as :class:`LazyRecords` (raw
    bytes, decoded on access)."""
    rows = np.frombuffer(slots, dtype=np.uint8, count=n * SLOT_SIZE).reshape(n, SLOT_SIZE)
    return LazyRecords(rows[keep].tobytes(), strings)


def _keep_max(d: Dict[Any, Record], key: Any, r: Record) -> None:
    """Keep in ``d[key]`` the record with the highest (seq, idx): distinct string ids can
    name one group (a string written twice)."""
    cur = d.get(key)
    if cur is None or (r.get("seq") or 0, r["idx"]) >= (cur.get("seq") or 0, cur["idx"]):
        d[key] = r
