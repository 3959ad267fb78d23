"""Stragglers (issue 43): the rank that every recent step waits for while the job still
progresses - who, by how much, in which phase, since which step. Pure.

In: each rank's ``RingSummary.history`` (the compact summary's newest collective, phase and
step records; Flight Recorder entries of C++-issued collectives when the snapshot joined
them). Out: a :class:`Straggler` or None. ``series`` builds each group's recent instances
and arrivals, ``detect`` decides (robust statistics, thresholds), ``when`` finds the first
slow step and the phase. How it decides and why the thresholds: docs/STRAGGLERS.md.

Read by ``diagnose`` (``details['straggler']``, every verdict; the wording of a progressing
one), the watcher (``watch/stragglerwatch.py``: a log line when it starts, one when it
ends) and the timeline (the straggler's track).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from hangtrace.tracer.analyze.context import Ctx
from hangtrace.tracer.analyze.straggler.detect import (
    MAX_PERIOD,
    MIN_STEPS,
    WINDOW_STEPS,
    Candidate,
    candidate,
    units,
)
from hangtrace.tracer.analyze.straggler.series import WINDOW, by_group, collective_rows, instances, more_rows
from hangtrace.tracer.analyze.straggler.seen import episode_at, resolve
from hangtrace.tracer.analyze.straggler.when import phase, since
from hangtrace.tracer.diagnosis import Diagnosis
from hangtrace.tracer.ring.summary import HISTORY
from hangtrace.tracer.stragglerseen import SeenStraggler

__all__ = ["Straggler", "find", "of_processes", "with_seen"]


@dataclass(frozen=True)
class Straggler:
    """The slow rank of one group. ``rank``: global; ``added_ms_per_step``: what the group
    waited for it alone per step over the window; ``added_pct``: that in % of the step time
    (None when the step time is unknown); ``since_step``: its first slow step (None: slow from
    before ``oldest_step``, the oldest step compared); ``collectives``: of the window's
    ``window_collectives``, in how many it issued last; ``window_steps``: steps in the window
    (collectives when the job records no steps), ``last_steps`` of which it was last in; ``margin_ms``/``noise_ms``/``threshold_ms``:
    the decision's figures (``detect``)."""

    rank: int
    group: str
    added_ms_per_step: float
    added_pct: Optional[float]
    phase: Optional[str]
    since_step: Optional[int]
    collectives: int
    window_steps: int
    window_collectives: int
    margin_ms: float
    noise_ms: float
    threshold_ms: float
    step_ms: Optional[float]
    oldest_step: Optional[int]
    members: int
    last_steps: int
    since_source: Optional[str] = None
    before_step: Optional[int] = None
    first_seen_wall_ns: Optional[int] = None
    first_seen_step: Optional[int] = None
    newest_step: Optional[int] = None
    z: float = 3.0

    def details(self) -> Dict[str, Any]:
        """``Diagnosis.details['straggler']`` (docs/DIAGNOSIS.md)."""
        return {
            "rank": self.rank,
            "group": self.group,
            "added_ms_per_step": round(self.added_ms_per_step, 3),
            "added_pct": None if self.added_pct is None else round(self.added_pct, 1),
            "phase": self.phase,
            "since_step": self.since_step,
            "collectives": self.collectives,
            "window_steps": self.window_steps,
            "window_collectives": self.window_collectives,
            "margin_ms": round(self.margin_ms, 3),
            "noise_ms": round(self.noise_ms, 3),
            "threshold_ms": round(self.threshold_ms, 3),
            "step_ms": None if self.step_ms is None else round(self.step_ms, 3),
            "oldest_step": self.oldest_step,
            "group_size": self.members,
            "last_steps": self.last_steps,
            "since_source": self.since_source,
            "before_step": self.before_step,
            "first_seen_wall_ns": self.first_seen_wall_ns,
            "first_seen_step": self.first_seen_step,
            "newest_step": self.newest_step,
            "judged_by": "rings",
        }


def _straggler(c: Candidate, histories: Mapping[int, Sequence[Any]]) -> Straggler:
    first, oldest = since(c, histories)
    newest = c.inst.by_rank[-1][c.col].step if c.inst.by_rank else None
    return Straggler(
        rank=c.rank,
        group=c.inst.group,
        added_ms_per_step=c.added_ms,
        added_pct=100.0 * c.added_ms / c.step_ms if c.step_ms else None,
        phase=phase(c, histories),
        since_step=first,
        collectives=len(c.last),
        window_steps=c.steps,
        window_collectives=len(c.inst.seqs),
        margin_ms=c.margin_ms,
        noise_ms=c.noise_ms,
        threshold_ms=c.threshold_ms,
        step_ms=c.step_ms,
        oldest_step=oldest,
        members=len(c.inst.ranks),
        last_steps=c.last_steps,
        since_source="rings" if first is not None else None,
        before_step=oldest if first is None else None,
        newest_step=newest,
        z=c.z,
    )


#: ``(collective_rows(histories), by_group(collective_rows(histories)))``
Rows = Tuple[Dict[int, List[Any]], Dict[str, Dict[int, Dict[int, Any]]]]


def read_rows(histories: Mapping[int, Sequence[Any]]) -> Rows:
    """The newest collective rows of ``histories`` and the same by group, read once for
    :func:`find` and :func:`judgeable` (a snapshot with no straggler read them twice: half
    the pass at 512 ranks)."""
    coll = collective_rows(histories)
    return coll, by_group(coll)


def find(histories: Mapping[int, Sequence[Any]], rows: Optional[Rows] = None) -> Optional[Straggler]:
    """The straggler of ``{global rank: RingSummary.history}``: of the groups with one, the
    one the group waits longest for per step; None when nobody is slow. ``rows``:
    :func:`read_rows` of ``histories`` when the caller has them."""
    found: List[Candidate] = []
    wide: Optional[Dict[str, Dict[int, Any]]] = None
    coll, groups = rows if rows is not None else read_rows(histories)
    for group, members in sorted(groups.items()):
        inst = instances(group, members)
        if inst is not None and len(units(inst, WINDOW_STEPS)) < WINDOW_STEPS and len(inst.seqs) >= WINDOW:
            # many collectives per step (an all-reduce per parameter): WINDOW seqs are
            # fewer than WINDOW_STEPS steps; the whole history's, at most MAX_PERIOD per step
            wide = wide if wide is not None else by_group(more_rows(histories, coll, HISTORY))
            inst = instances(group, wide.get(group, members), window=WINDOW_STEPS * MAX_PERIOD)
        c = candidate(inst) if inst is not None else None
        if c is not None:
            found.append(c)
    if not found:
        return None
    return _straggler(max(found, key=lambda c: c.added_ms), histories)


def _histories(procs: Mapping[int, Any]) -> Dict[int, Sequence[Any]]:
    return {r: p.summary.history for r, p in procs.items() if p.summary is not None}


def of_processes(procs: Mapping[int, Any], rows: Optional[Rows] = None) -> Optional[Straggler]:
    """:func:`find` over ``{global rank: ProcessInfo}`` (their summaries' histories;
    ``rows``: their :func:`read_rows` when the caller has them)."""
    return find(_histories(procs), rows)


def with_seen(st: Straggler, seen: Sequence[SeenStraggler], at_wall_ns: int) -> Straggler:
    """``st`` with its start completed from the watcher's episodes (``seen.resolve``: when the
    rings cannot see the start; ``at_wall_ns``: the newest record's wall time, 0 unknown)."""
    got = resolve(st.rank, st.group, st.since_step, st.oldest_step, seen, at_wall_ns)
    return dataclasses.replace(
        st,
        since_step=got.since_step,
        since_source=got.source,
        before_step=got.before_step,
        first_seen_wall_ns=got.first_seen_wall_ns,
        first_seen_step=got.first_seen_step,
    )


def _newest_wall_ns(procs: Sequence[Any]) -> int:
    return max([int(getattr(p, "progress_wall_ns", 0) or 0) for p in procs] or [0])


def straggler_details(ctx: Ctx, d: Diagnosis) -> None:
    """``d.details['straggler']`` (``Straggler.details``) and one evidence line when a rank of
    ``ctx.views`` is slow; else, when the records hold too few collectives to judge and a
    node watcher's episode was under way at their newest record, the watcher's word
    (:func:`watchers_word`); nothing otherwise. The verdict is not changed: a progressing one
    names it in its paragraph (``report/rankparagraph.py``), any other keeps it as a fact seen
    before. Never raises (odd records: no straggler)."""
    try:
        procs = {r: v.proc for r, v in ctx.views.items()}
        rows = read_rows(_histories(procs))
        st = of_processes(procs, rows)
        snap = ctx.snap
        at = _newest_wall_ns(snap.processes) or snap.taken_wall_ns
        if st is None:
            watchers_word(ctx, d, procs, at, rows)
            return
        st = with_seen(st, snap.stragglers_seen, at)
    except Exception:
        return
    d.details["straggler"] = st.details()
    ctx.add(
        "rank %d issued last in %d of the newest %d steps (%d of %d collectives) of group '%s': a median "
        "%.1f ms after the other ranks, above %.1f ms (the largest of the others' noise %.1f ms x %g, 5 ms "
        "and 5 %% of the step)"
        % (
            st.rank,
            st.last_steps,
            st.window_steps,
            st.collectives,
            st.window_collectives,
            st.group,
            st.margin_ms,
            st.threshold_ms,
            st.noise_ms,
            st.z,
        )
    )


def judgeable(histories: Mapping[int, Sequence[Any]], rows: Optional[Rows] = None) -> bool:
    """Do the histories hold a group with :data:`detect.MIN_STEPS` steps every member shared
    (enough to name a straggler or to say nobody is one)? ``rows``: :func:`read_rows` of
    ``histories`` when the caller has them."""
    for group, members in (rows if rows is not None else read_rows(histories))[1].items():
        inst = instances(group, members)
        if inst is not None and len(units(inst, WINDOW_STEPS)) >= MIN_STEPS:
            return True
    return False


def watchers_word(
    ctx: Ctx, d: Diagnosis, procs: Mapping[int, Any], at: int, rows: Optional[Rows] = None
) -> None:
    """When ``procs`` hold too few shared collectives to judge (a DDP job's rings without
    Flight Recorder dumps: a snapshot taken after its ranks exited) and a watcher episode
    with the watcher's own figures was under way at ``at`` (``seen.episode``): those figures
    as ``details['straggler']`` (``judged_by`` 'watcher') and an evidence line."""
    if judgeable(_histories(procs), rows):
        return
    e = episode_at(ctx.snap.stragglers_seen, at)
    if e is None or not e.last:
        return
    st = dict(e.last, judged_by="watcher", first_seen_wall_ns=e.first_seen_wall_ns)
    st["first_seen_step"] = e.first_seen_step
    if st.get("since_step") is None and e.since_step is not None:
        st.update(since_step=e.since_step, since_source="watcher", before_step=None)
    d.details["straggler"] = st
    ctx.add(
        "the node watcher saw rank %s slow in group '%s' from %s until %s (its figures); these records "
        "hold too few collectives to judge (C++-issued ones, as DDP's, are only in torch's Flight "
        "Recorder, which was not dumped here)"
        % (
            e.rank,
            e.group,
            _clock(e.first_seen_wall_ns),
            _clock(e.ended_wall_ns) if e.ended_wall_ns else "now",
        )
    )


def _clock(wall_ns: int) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(wall_ns / 1e9))
