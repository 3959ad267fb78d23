"""A death against the start of a hang: did the rank live on past it, or die into it (pure).

In: a dead rank's view (``rankview.RankView``, deaths filled by ``deaths.fill_death``) and
the time the others began waiting (ns since the epoch). Out: whether it provably lived on
after that time (:func:`death_after`: then its death did not cause the hang), whether it
recorded a step of its own since (:func:`moved_on_after`), and whether it died within
``DIED_INTO_HANG_NS`` of it (:func:`died_soon_after`: it died *into* the hang). Used by the
arbiter and the chain ends of the wait-for graph.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Optional

from hangtrace.tracer.analyze.failures.causes import KILLED, base_cause, is_stop_error
from hangtrace.tracer.diagnosis import Cause

if TYPE_CHECKING:
    from hangtrace.tracer.analyze.rankview import RankView

#: A culprit that died within this many ns of the moment the others began waiting for it
#: died *into* the hang (killed mid-step just after issuing its collective): the death is
#: the root. Later deaths of a hung culprit (a user's kill of a stuck job) leave the hang
#: verdict standing.
DIED_INTO_HANG_NS = 2_000_000_000


def death_after(v: RankView, start: int) -> bool:
    """True when dead rank ``v`` provably lived on after ``start`` (ns): its death time
    is exact (signal dump, exception, exit record) and later, or - for a death without a
    record, whose time is only a lower bound - it issued something after ``start``
    (the completion of its last collective does not count).

    A rank that raised an exception of its own (not a stop - ``STOP_ERRORS`` - and not a
    transport victim) after ``start`` without having moved on first
    (:func:`moved_on_after`) did not live on past the wait: it was on its way to the
    collective (a DataLoader waiting for a worker the kernel OOM-killed, a slow rank-only
    step that then crashed) and the exception is why it never came (CI 2026-12-04, blind
    job tr_dl_oom: rank 1 raised 3 s after rank 0 began waiting and was called
    'skipped-collective: moved on' for its dying records)."""
    if v.cause == KILLED or (v.mem or {}).get("base_cause") == KILLED:
        return bool(v.activity_wall and v.activity_wall > start)
    if not (v.fail_wall and v.fail_wall > start):
        return False
    if base_cause(v) == Cause.EXCEPTION.value and not v.victim and not is_stop_error(v.cause_text):
        return moved_on_after(v, start)
    return True


def _t_wall(rec: Optional[Mapping[str, Any]]) -> int:
    return int((rec or {}).get("t_wall_ns") or 0)


def moved_on_after(v: RankView, start: int) -> bool:
    """True when ``v`` recorded a step of its own after ``start`` (ns): a collective or
    p2p issued, a phase entered, a step or group record. Its dying records (exception,
    exit, ``destroy_process_group``, the phase exits the exception unwound) are not;
    neither are memory samples."""
    sm = v.proc.summary
    if sm is None:
        return bool(v.activity_wall and v.activity_wall > start)
    t = _t_wall
    if t(sm.last_comm) > start or any(t(enter) > start for enter, _exit in sm.phase_visits.values()):
        return True
    for rec in reversed(sm.tail):  # newest first; the tail holds the newest TAIL records
        if t(rec) <= start:
            break
        if rec.get("kind") in _MOVE_KINDS:
            return True
    return False


#: record kinds that are a step of the rank's own (``moved_on_after``)
_MOVE_KINDS = ("collective", "p2p", "step", "phase_enter", "group")


def died_soon_after(v: RankView, start: int) -> bool:
    """True when ``v``'s last sign of life is within DIED_INTO_HANG_NS of ``start`` (ns)."""
    last = max(v.activity_wall or 0, v.fail_wall or 0)
    return bool(last) and last - start < DIED_INTO_HANG_NS
