"""One rank's indexed view: the data every analysis of a rank reads (pure).

In: one ``ProcessInfo`` (its compact ``summary``, its ``inflight`` record, its stacks for
an async wait). Out: a :class:`RankView` (:func:`index_process`): the per-group and
per-peer newest records, the record the rank is blocked in, its first failed record, its
last sign of life, last activity and progress (ns since the epoch). The death fields
(``dead``, ``cause``, ``victim``, ``fail_wall``, ...) are filled afterwards by
``failures/deaths.fill_death``, the memory attribution by ``analyze/memory``; the context
(``context.Ctx``) holds one view per rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from hangtrace.tracer.ring.heartbeats import heartbeat_names, newest_work_wall
from hangtrace.tracer.analyze.failures.causes import is_transport_error, rec_fail_wall
from hangtrace.tracer.analyze.stuck.workwait import async_wait
from hangtrace.tracer.snapshot import ProcessInfo

#: One flight record (keys: ``tracer.ring.records.decode_slots``). The one place to point
#: at the typed record of ``tracer/ring/records.py`` once it exists.
Record = Mapping[str, Any]
#: progress stamped within this many ns after the end of a rank's last record is that
#: record's completion, not new activity (the recorder stamps both at completion)
COMPLETION_SLACK_NS = 50_000_000


@dataclass
class RankView:
    """What the analysis needs of one rank (built by :func:`index_process`, deaths filled
    by ``deaths.fill_death``). Mutable on purpose: the arbiter re-runs the wait-for graph
    with every death marked a victim when a stalled job was stopped.

    ``last``: group -> newest collective record; ``p2p``: (group, peer) -> newest p2p
    record; ``blocked``: the record the rank waits in; ``*_wall``: ns since the epoch.
    """

    rank: int
    proc: ProcessInfo
    last: Dict[Any, Record] = field(default_factory=dict)
    p2p: Dict[Tuple[Any, Any], Record] = field(default_factory=dict)
    blocked: Optional[Record] = None
    blocked_failed: bool = False
    last_wall: int = 0
    activity_wall: int = 0
    progress_wall: int = 0  # newest progress: a progress record or the header's stamp (not a memory sample)
    last_rec: Optional[Record] = None
    failed: Optional[Record] = None
    dead: bool = False
    cause: Optional[str] = None
    cause_text: Optional[str] = None
    victim: bool = False
    departed: bool = False  # exited cleanly first, its peers then failed (analyze/failures/departures.py)
    teardown: str = ""  # the SIGTERM after its failure, or the Ray teardown it is a victim of (analyze/failures/teardown.py)
    fail_wall: int = 0
    phase: Optional[str] = None
    step: Optional[int] = None
    nrec: int = 0
    mem: Optional[Dict[str, Any]] = None  # memory attribution (analyze.memory.attribute), issue 5


def index_process(rank: int, proc: ProcessInfo) -> RankView:
    """The rank's view from its compact summary (``proc.summary``, built by the reader in
    one vectorised pass, or from ``proc.records`` for synthetic snapshots): the
    per-group / per-peer newest records, the blocked record, the first failed record,
    last sign of life and last activity. Deaths are not filled here (``deaths.fill_death``)."""
    v = RankView(rank, proc)
    sm = proc.summary
    assert sm is not None  # ProcessInfo computes it from its records when not given
    v.last.update(sm.by_group)
    v.p2p.update(sm.by_peer)
    lastcp: Optional[Record] = sm.last_comm
    last_wall = 0
    activity = 0
    prog = proc.progress_wall_ns or 0
    lr = sm.last
    if lr is not None:
        v.last_rec = lr
        last_wall = lr.get("t_wall_ns") or 0
        activity = last_wall
        # progress stamped by the completion of the last record is not new activity
        if prog and not (
            lr.get("state") in ("completed", "failed") and prog <= rec_fail_wall(lr) + COMPLETION_SLACK_NS
        ):
            activity = max(activity, prog)
    else:
        activity = prog
    v.nrec = sm.count
    v.last_wall = max(last_wall, prog)
    lp = sm.last_progress
    v.progress_wall = max((lp.get("t_wall_ns") or 0) if lp is not None else 0, prog)
    if lp is not None and lp.get("kind") in _PHASE_KINDS:
        v.progress_wall = _past_heartbeats(sm.tail, v.progress_wall)
    v.activity_wall = activity
    v.failed = sm.first_failed
    inf = proc.inflight
    if (
        isinstance(inf, dict)
        and inf.get("kind") in ("collective", "p2p")
        and inf.get("state", "issued") == "issued"
    ):
        v.blocked = inf
    elif lastcp is not None:
        st = lastcp.get("state")
        if st == "issued" and not lastcp.get("async_op"):
            v.blocked = lastcp
        elif st == "failed" and is_transport_error(lastcp.get("error")):
            v.blocked = lastcp
            v.blocked_failed = True
    if v.blocked is None:  # an async op waited for in Work.wait() (C++: no torch frame on the stack)
        v.blocked = async_wait(v)
    v.phase = proc.phase if proc.phase is not None else (v.last_rec or {}).get("phase")
    if (
        v.phase is not None
        and lp is not None
        and lp.get("phase") == v.phase
        and lp.get("kind") in _PHASE_KINDS
    ):
        if v.phase in heartbeat_names(sorted(sm.tail, key=lambda r: int(r.get("idx") or 0))):
            v.phase = None  # a framework's heartbeat (Ray Train's poll_status) is no phase of the job
    v.step = proc.step if proc.step is not None else (v.last_rec or {}).get("step")
    return v


_PHASE_KINDS = ("phase_enter", "phase_exit")


def _past_heartbeats(tail: Sequence[Record], progress_wall: int) -> int:
    """The newest progress of a process whose newest progress record is a phase's, not
    counting a framework's heartbeats (``ring/heartbeats.py``: Ray Train's ``poll_status``)
    among its newest records ``tail`` (oldest first); ``progress_wall`` when the newest
    progress is no heartbeat. When the tail holds heartbeats only, the work is older than
    the tail: its oldest record's time."""
    recs = sorted(tail, key=lambda r: int(r.get("idx") or 0))
    work, beat_after = newest_work_wall(recs)
    if not beat_after:
        return progress_wall
    return work or int((recs[0].get("t_wall_ns") if recs else 0) or 0) or progress_wall
