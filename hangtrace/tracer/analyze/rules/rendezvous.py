"""Rule *rendezvous* -> 'skipped-collective', cause 'extra-collective': ranks wait in a torch
collective for a rank that waits for them at a Ray actor's method (issue 37;
``analyze/actors/rendezvous.py``), and their collective is new to their loop.

Ray Train's ``ray.train.report`` meets every worker at ``SynchronizationActor.
broadcast_from_rank_zero``. When rank 0 alone enters a ``dist.barrier()`` (a rank-0-only
checkpoint helper), rank 1 goes on to the report and waits at the actor for rank 0, which
waits in the barrier for rank 1: a cycle through two kinds of meeting. The wait-for graph of
collectives sees only rank 0 -> rank 1 and named rank 1 "stuck outside collectives"
(blind job rt_rank0_barrier, 2026-12-07). Each waiter's own history decides
(``graph/history.habit``): a collective none of its earlier steps issued (new or out of
place) is the extra one and its ranks are the culprits; the rank at the actor is cascade.
A routine collective (the loop issues it every step) leaves the verdict to rule *chain*
(the rank at the actor skipped it), as does an undecided history.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

from hangtrace.tracer.analyze.actors.rendezvous import Rendezvous, rendezvous_wait
from hangtrace.tracer.analyze.context import Ctx
from hangtrace.tracer.analyze.evidence import fill_common, rk
from hangtrace.tracer.analyze.graph.history import CHANGED, Habit, habit
from hangtrace.tracer.analyze.graph.waitgraph import Inst, inst_text
from hangtrace.tracer.analyze.rules.base import Finding
from hangtrace.tracer.analyze.stuck.chainends import chain_ends
from hangtrace.tracer.diagnosis import Cause, Diagnosis, Kind

NAME = "rendezvous"


def _explained(ctx: Ctx, end: int, insts: Tuple[Inst, ...]) -> Optional[Tuple[Inst, Rendezvous, List[Habit]]]:
    for inst in sorted(insts, key=lambda i: (i.start or 0, -len(i.waiters))):
        if inst.p2p or not inst.waiters or end not in inst.behind:
            continue
        rz = rendezvous_wait(ctx, end, inst.waiters)
        if rz is None:
            continue
        habits = [habit(ctx, w, inst.group, ctx.blocked(w)) for w in inst.waiters]
        if all(h.status in CHANGED for h in habits):
            return inst, rz, habits
    return None


def find(ctx: Ctx) -> Optional[Finding]:
    """The waiters of a collective whose missing rank waits for them at an actor method,
    when that collective is new to their loops (``data``: (instance, Rendezvous, habits))."""
    ce = chain_ends(ctx)
    for end in ce.present:
        if ctx.views[end].dead:
            continue
        got = _explained(ctx, end, ce.insts_for.get(end, ()))
        if got is not None:
            inst = got[0]
            return Finding(NAME, tuple(sorted(inst.waiters)), inst.start, data=got)
    return None


def explain(ctx: Ctx, finding: Finding, d: Diagnosis) -> None:
    """The extra collective, the rank at the actor as cascade; ``details['rendezvous']`` (with
    ``culprit_status``: str(rank) -> its collective's status in its loop, ``graph/history``)."""
    inst, rz, habits = finding.data
    d.kind = Kind.SKIPPED_COLLECTIVE
    d.cause = Cause.EXTRA_COLLECTIVE
    fill_common(ctx, d, finding.culprits, inst)
    d.details["rendezvous"] = dict(rz.details(), culprit_status={str(h.rank): h.status for h in habits})
    for h in habits:
        ctx.add(h.text)
    ctx.add(
        "rank %d waits in %s on thread %s for %s: every rank calls it in turn (a rendezvous through a Ray "
        "actor, as Ray Train's report is), and %s last called it before rank %d's wait began and "
        "waits in %s %s instead (cascade)"
        % (
            rz.rank,
            rz.target.text(),
            rz.thread,
            rk(list(rz.behind), 8),
            rk(list(rz.behind), 8),
            rz.rank,
            ctx.blocked(inst.waiters[0]).get("op"),
            inst_text(ctx, inst),
        )
    )
