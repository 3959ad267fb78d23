"""Compact per-process summary of a ring: what the analysis reads, without a dict per record.

A ring holds up to ``nslots`` records (2,000+ per rank); the analysis needs only a few of
them per process. :func:`summarize_records` computes the summary from decoded record dicts (the pure
Python path: no numpy, synthetic snapshots, ``hangtrace records``); ``ring/slotsummary.py``'s
``summarize_slots`` finds the same records with one vectorised pass over the slot array
(numpy) and decodes only them. Both give equal
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
  access, :class:`LazyRecords`); ``memory``: every memory sample;
* ``history``: the newest :data:`HISTORY` collective, phase-enter/exit and step records
  (index order; numpy path: raw slots like ``tail``): each collective's issue time, group
  and seq and the phase timings the straggler analysis reads (``analyze/straggler/``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from hangtrace.tracer.ring.frrecords import FR_JOINED_SOURCE, FR_SOURCE


#: records kept in ``RingSummary.tail`` (newest first out)
TAIL = 256
#: records kept in ``RingSummary.history`` (collective, phase and step records only)
HISTORY = 512
#: record kinds kept in ``RingSummary.history``
HISTORY_KINDS = ("collective", "phase_enter", "phase_exit", "step")
#: record kinds that are progress (the analysis' "last progress" of a rank)
PROGRESS_KINDS = ("collective", "p2p", "step", "phase_enter", "phase_exit", "group")

AnyRecord = Mapping[str, Any]


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
    history: Sequence[AnyRecord] = ()

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
                seen.setdefault(record_key(r), r)
        return in_stream_order(seen.values())


def record_key(r: AnyRecord) -> Any:
    """One record's identity within its process's stream: its ring index (``idx``), kept
    apart from a Flight Recorder entry's, which is torch's record id (``frrecords``: its own
    numbering, the same small numbers as ours), else the dict itself. Keyed by ``idx``
    alone, a joined stream lost collectives to ring records of the same number: a node
    summary kept DDP's startup broadcast and dropped the all-reduce its ranks waited in."""
    idx = r.get("idx")
    return (r.get("source") == FR_SOURCE, idx) if idx is not None else id(r)


def in_stream_order(records: Any) -> List[AnyRecord]:
    """``records`` (an iterable of dicts) oldest first: by ring index, or, once any
    Flight Recorder entry is among them (a joined stream, ``frrecords.merge_records``), by
    wall time with ours first on ties, as the join orders them."""
    recs = list(records)
    if any(r.get("source") in (FR_SOURCE, FR_JOINED_SOURCE) or r.get("idx") is None for r in recs):
        return sorted(
            recs, key=lambda r: (r.get("t_wall_ns") or 0, r.get("source") == FR_SOURCE, r.get("idx") or 0)
        )
    return sorted(recs, key=lambda r: r.get("idx") or 0)


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
    history: List[AnyRecord] = []
    for r in records:
        kind = r.get("kind")
        if kind == "memory":  # half of a joined stream (issue 40): nothing else reads them
            memory.append(r)
            continue
        if kind == "phase_exit" or kind == "phase_enter" or kind == "ray_wait":
            _note_phase_or_wait(r, kind, exits, enters, waits)
        if kind in HISTORY_KINDS:
            history.append(r)
        if kind == "collective" or kind == "p2p":
            if kind == "collective":
                _keep_newest_seq(by_group, r.get("group"), r)
            else:
                _keep_newest_seq(by_peer, (r.get("group"), r.get("peer")), r)
            last_comm = r
            if first_failed is None and r.get("state") == "failed":
                first_failed = r
        if kind in PROGRESS_KINDS:
            t = r.get("t_wall_ns") or 0
            if t >= best_t:
                best_t, last_progress = t, r
    inflight = blocked_in(_issued_at(records, inflight_idx), last_comm)
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
        failed_phases=failed_phases_of(exits),
        phase_visits=phase_visits_of(enters, exits),
        waits=waits,
        history=tuple(history[-HISTORY:]),
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


def blocked_in(inflight: Optional[AnyRecord], last_comm: Optional[AnyRecord]) -> Optional[AnyRecord]:
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


def failed_phases_of(exits: Mapping[str, AnyRecord]) -> Dict[str, AnyRecord]:
    """``RingSummary.failed_phases`` of the newest phase exit per phase (``exits``)."""
    return {k: r for k, r in exits.items() if r.get("state") == "failed"}


def phase_visits_of(
    enters: Mapping[str, AnyRecord], exits: Mapping[str, AnyRecord]
) -> Dict[str, Tuple[Optional[AnyRecord], Optional[AnyRecord]]]:
    """``RingSummary.phase_visits`` of the newest phase enter and exit per phase."""
    return {k: (enters.get(k), exits.get(k)) for k in sorted(set(enters) | set(exits))}


def wait_key(r: Any) -> Optional[str]:
    """The key of wait record ``r`` in ``RingSummary.waits``: its thread for a ``ray.get`` /
    ``ray.wait``; ``'<thread>#<n>'`` for await number ``n``, or None for a completed await
    (not kept)."""
    n = r.get("numel") or 0
    if not n:
        t = r.get("thread")
        return None if t is None else str(t)
    return None if r.get("state") == "completed" else "%s#%d" % (r.get("thread"), n)
