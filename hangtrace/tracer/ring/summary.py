"""Compact per-process summary of a ring: what the analysis reads, without a dict per record.

A ring holds up to ``nslots`` records (2,000+ per rank); the analysis needs only a few of
them per process. :func:`summarize_slots` finds those with one vectorised pass over the
slot array (numpy, a structured dtype matching ``layout.SLOT``) and decodes only them;
:func:`summarize_records` computes the same summary from decoded record dicts (the pure
Python path: no numpy, synthetic snapshots, ``hangtrace records``). Both give equal
results (tests/unit/test_summary.py compares them on real and wrapped rings).

Selection rules (the ones the analysis has always applied to the full record list):

* ``by_group``: per process group, the collective with the highest ``seq`` (of equal
  ``seq``, the newest index) - only the per-group maximum is trusted once a ring wrapped;
* ``by_peer``: the same per ``(group, peer)`` for p2p records;
* ``last_comm``: the newest collective/p2p record (what the rank is blocked in, if issued);
* ``first_failed``: the oldest collective/p2p record in state 'failed';
* ``last``: the newest record of any kind; ``count``: valid records in the window;
* ``last_progress``: the progress record (collective, p2p, step, phase enter/exit, group)
  with the newest ``t_wall_ns`` (of equal times, the newest index);
* ``inflight``: the record the header names as in flight, if still 'issued', else
  ``last_comm`` when it is 'issued' and not async;
* ``failed_phases``: per phase name, the newest phase-exit record of that phase when it
  failed (a Ray actor method, or a ``tracer.phase``, that raised and has not completed
  since);
* ``phase_visits``: per phase name, the newest phase-enter and phase-exit records
  (``(enter, exit)``, either None): whether a rank went through a phase after its last
  collective on a group (``rules/left_phase.py``);
* ``waits``: per thread name, the newest Ray wait record (kind 'ray_wait', ``hooks/
  ray_calls.py``: a ``ray.get``/``ray.wait`` on actor-call results; 'issued' = still waiting);
  an await (``numel`` = its await number, not 0) is a wait of its own, keyed
  ``'<thread>#<number>'`` (one event-loop thread awaits many calls at once), kept unless
  it completed (:func:`wait_key`);
* ``tail``: the newest :data:`TAIL` records (numpy path: kept as raw slots, decoded on
  access, :class:`LazyRecords`); ``memory``: every memory sample.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

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
from hangtrace.tracer.ring.records import Record, decode

#: records kept in ``RingSummary.tail`` (newest first out)
TAIL = 256
#: record kinds that are progress (the analysis' "last progress" of a rank)
PROGRESS_KINDS = ("collective", "p2p", "step", "phase_enter", "phase_exit", "group")
_PROGRESS_IDS = (K_COLL, K_P2P, K_STEP, K_PHASE_ENTER, K_PHASE_EXIT, K_GROUP)

AnyRecord = Mapping[str, Any]


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

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(other) == len(self) and all(a == b for a, b in zip(self, other))

    def __hash__(self) -> int:
        return hash(self._raw)

    def __repr__(self) -> str:
        return "LazyRecords(%d records)" % len(self)


@dataclass(frozen=True)
class RingSummary:
    """What the analysis reads of one process's records (see the module docstring).

    Records are the dicts of ``ring/records.py``. ``count``: number of valid records;
    ``by_group``: {group name: record}; ``by_peer``: {(group name, peer rank): record}.
    """

    count: int = 0
    last: Optional[AnyRecord] = None
    last_comm: Optional[AnyRecord] = None
    first_failed: Optional[AnyRecord] = None
    last_progress: Optional[AnyRecord] = None
    inflight: Optional[AnyRecord] = None
    by_group: Mapping[Optional[str], AnyRecord] = field(default_factory=dict)
    by_peer: Mapping[Tuple[Optional[str], int], AnyRecord] = field(default_factory=dict)
    tail: Sequence[AnyRecord] = ()
    memory: Tuple[AnyRecord, ...] = ()
    failed_phases: Mapping[str, AnyRecord] = field(default_factory=dict)
    phase_visits: Mapping[str, Tuple[Optional[AnyRecord], Optional[AnyRecord]]] = field(default_factory=dict)
    waits: Mapping[Optional[str], AnyRecord] = field(default_factory=dict)

    def records(self) -> List[AnyRecord]:
        """The records the analysis reads, once each, in index order: the singles above,
        ``by_group``, ``by_peer`` and ``memory`` (not the tail). A subset of the ring in which
        the analysis finds the same newest-per-group/peer, blocked-in, first failure, last
        record and last progress as in the full list."""
        seen: Dict[Any, AnyRecord] = {}
        single = (self.last, self.last_comm, self.first_failed, self.last_progress, self.inflight)
        for r in (
            *single,
            *self.by_group.values(),
            *self.by_peer.values(),
            *self.memory,
            *self.failed_phases.values(),
            *self.waits.values(),
            *(r for pair in self.phase_visits.values() for r in pair),
        ):
            if r is not None:
                seen.setdefault(r.get("idx", id(r)), r)
        return sorted(seen.values(), key=lambda r: r.get("idx") or 0)


def summarize_records(records: Sequence[AnyRecord], inflight_idx: int = 0, tail: int = TAIL) -> RingSummary:
    """The summary of decoded ``records`` (in index order), pure Python.

    ``inflight_idx``: the header's in-flight record index (0 = none). Missing keys read as
    None (synthetic records).
    """
    by_group: Dict[Optional[str], AnyRecord] = {}
    by_peer: Dict[Tuple[Optional[str], int], AnyRecord] = {}
    last_comm = first_failed = last_progress = None
    best_t = -1
    memory = []
    exits: Dict[str, AnyRecord] = {}
    enters: Dict[str, AnyRecord] = {}
    waits: Dict[Optional[str], AnyRecord] = {}
    for r in records:
        kind = r.get("kind")
        _note_phase_or_wait(r, kind, exits, enters, waits)
        if kind == "collective":
            _keep_newest_seq(by_group, r.get("group"), r)
        elif kind == "p2p":
            _keep_newest_seq(by_peer, (r.get("group"), r.get("peer")), r)
        elif kind == "memory":
            memory.append(r)
        if kind == "collective" or kind == "p2p":
            last_comm = r
            if first_failed is None and r.get("state") == "failed":
                first_failed = r
        if kind in PROGRESS_KINDS:
            t = r.get("t_wall_ns") or 0
            if t >= best_t:
                best_t, last_progress = t, r
    inflight = _blocked_in(_issued_at(records, inflight_idx), last_comm)
    return RingSummary(
        count=len(records),
        last=records[-1] if records else None,
        last_comm=last_comm,
        first_failed=first_failed,
        last_progress=last_progress,
        inflight=inflight,
        by_group=by_group,
        by_peer=by_peer,
        tail=tuple(records[-tail:]) if tail else (),
        memory=tuple(memory),
        failed_phases=_failed_phases(exits),
        phase_visits=_phase_visits(enters, exits),
        waits=waits,
    )


def _note_phase_or_wait(
    r: AnyRecord,
    kind: Any,
    exits: Dict[str, AnyRecord],
    enters: Dict[str, AnyRecord],
    waits: Dict[Optional[str], AnyRecord],
) -> None:
    """Keeps record ``r`` (of ``kind``) as the newest phase exit or enter of its phase, or
    the newest wait of its key (:func:`wait_key`); other records leave the dicts alone."""
    if kind == "phase_exit" and r.get("phase"):
        exits[str(r.get("phase"))] = r
    elif kind == "phase_enter" and r.get("phase"):
        enters[str(r.get("phase"))] = r
    elif kind == "ray_wait":
        wk = wait_key(r)
        if wk is not None or not r.get("numel"):
            waits[wk] = r


def _keep_newest_seq(d: Dict[Any, AnyRecord], key: Any, r: AnyRecord) -> None:
    """Keep in ``d[key]`` record ``r`` unless it has a lower ``seq`` (of equal ``seq``, the
    later record: records come in index order)."""
    cur = d.get(key)
    if cur is None or (r.get("seq") or 0) >= (cur.get("seq") or 0):
        d[key] = r


def _issued_at(records: Sequence[AnyRecord], inflight_idx: int) -> Optional[AnyRecord]:
    """The record of index ``inflight_idx`` (0 = none) among ``records`` when it is still
    'issued', else None."""
    if inflight_idx:
        for r in reversed(records):
            if r.get("idx") == inflight_idx:
                return r if r.get("state") == "issued" else None
    return None


def _blocked_in(inflight: Optional[AnyRecord], last_comm: Optional[AnyRecord]) -> Optional[AnyRecord]:
    """``RingSummary.inflight``: the header's in-flight record (``inflight``, None when not
    issued), else ``last_comm`` when it is 'issued' and not async."""
    if (
        inflight is None
        and last_comm is not None
        and last_comm.get("state") == "issued"
        and not last_comm.get("async_op")
    ):
        return last_comm
    return inflight


def _failed_phases(exits: Mapping[str, AnyRecord]) -> Dict[str, AnyRecord]:
    """``RingSummary.failed_phases`` of the newest phase exit per phase (``exits``)."""
    return {k: r for k, r in exits.items() if r.get("state") == "failed"}


def _phase_visits(
    enters: Mapping[str, AnyRecord], exits: Mapping[str, AnyRecord]
) -> Dict[str, Tuple[Optional[AnyRecord], Optional[AnyRecord]]]:
    """``RingSummary.phase_visits`` of the newest phase enter and exit per phase."""
    return {k: (enters.get(k), exits.get(k)) for k in sorted(set(enters) | set(exits))}


def summarize_slots(
    slots: bytes,
    nslots: int,
    strings: Dict[int, str],
    inflight_idx: int = 0,
    tail: int = TAIL,
    use_numpy: Optional[bool] = None,
) -> RingSummary:
    """The summary of a ring's slot array (``nslots * SLOT_SIZE`` bytes).

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
        from hangtrace.tracer.ring.reader import decode_slots

        return summarize_records(decode_slots(slots, nslots, strings), inflight_idx, tail)
    return _summarize_np(slots, nslots, strings, inflight_idx, tail)


_DTYPE: Any = None


def _slot_dtype() -> Any:
    """numpy structured dtype over ``layout.SLOT`` (only the fields the index reads)."""
    global _DTYPE
    if _DTYPE is None:
        import numpy as np

        fields = [
            ("idx", "<u8", 0),
            ("kind", "u1", 8),
            ("flags", "u1", 9),
            ("group", "<u4", 12),
            ("seq", "<i8", 16),
            ("numel", "<i8", 24),
            ("peer", "<i4", 36),
            ("thread", "<u4", 40),
            ("phase", "<u4", 44),
            ("t_wall", "<u8", 64),
            ("state", "u1", 72),
        ]
        _DTYPE = np.dtype(
            {
                "names": [f[0] for f in fields],
                "formats": [f[1] for f in fields],
                "offsets": [f[2] for f in fields],
                "itemsize": SLOT_SIZE,
            }
        )
        assert SLOT.size == SLOT_SIZE
    return _DTYPE


_LUT: Any = None


def _progress_lut(np: Any) -> Any:
    """Boolean lookup table: record kind id -> is a progress kind."""
    global _LUT
    if _LUT is None:
        _LUT = np.zeros(256, dtype=bool)
        _LUT[list(_PROGRESS_IDS)] = True
    return _LUT


def wait_key(r: Any) -> Optional[str]:
    """The key of wait record ``r`` in ``RingSummary.waits``: its thread for a ``ray.get`` /
    ``ray.wait``; ``'<thread>#<n>'`` for await number ``n``, or None for a completed await
    (not kept)."""
    n = r.get("numel") or 0
    if not n:
        t = r.get("thread")
        return None if t is None else str(t)
    return None if r.get("state") == "completed" else "%s#%d" % (r.get("thread"), n)


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

    arr = np.frombuffer(slots, dtype=_slot_dtype(), count=nslots)
    idx = arr["idx"].astype(np.int64)
    valid = (idx > 0) & ((idx - 1) % nslots == np.arange(nslots, dtype=np.int64))
    pos = np.flatnonzero(valid)
    if not len(pos):
        return RingSummary()
    pos = pos[np.argsort(idx[pos], kind="stable")]
    pos = pos[idx[pos] > idx[pos[-1]] - nslots]  # newest window only (torn leftovers dropped)
    kind = arr["kind"][pos]
    state = arr["state"][pos]
    cache: Dict[int, Record] = {}

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
        if valid[ip] and idx[ip] == inflight_idx and idx[ip] > idx[pos[-1]] - nslots:
            r = rec(ip)
            if r.get("state") == "issued":
                inflight = r
    return RingSummary(
        count=len(pos),
        last=rec(int(pos[-1])),
        last_comm=last_comm,
        first_failed=first_failed,
        last_progress=last_progress,
        inflight=_blocked_in(inflight, last_comm),
        by_group=by_group,
        by_peer=by_peer,
        tail=LazyRecords(
            np.frombuffer(slots, dtype=np.uint8, count=nslots * SLOT_SIZE)
            .reshape(nslots, SLOT_SIZE)[pos[-tail:]]
            .tobytes(),
            strings,
        )
        if tail
        else (),
        memory=tuple(rec(p) for p in pos[kind == K_MEM].tolist()),
        failed_phases=_failed_phases(exits),
        waits=waits,
        phase_visits=_phase_visits(enters, exits),
    )


def _keep_max(d: Dict[Any, Record], key: Any, r: Record) -> None:
    """Keep in ``d[key]`` the record with the highest (seq, idx): distinct string ids can
    name one group (a string written twice)."""
    cur = d.get(key)
    if cur is None or (r.get("seq") or 0, r["idx"]) >= (cur.get("seq") or 0, cur["idx"]):
        d[key] = r
