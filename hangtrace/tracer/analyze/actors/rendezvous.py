"""Ranks that meet at a Ray actor's method instead of a torch collective (issue 37). Pure.

Ray Train's ``ray.train.report`` is a barrier across its workers through an actor: every
worker calls ``SynchronizationActor.broadcast_from_rank_zero`` once per report and the
actor answers when all have called (Ray 2.60, ``ray/train/v2/_internal/execution/
checkpoint/sync_actor.py``; no timeout by default). A user's own barrier actor works the
same way. Such a call is a collective in all but name: a rank waiting in it waits for the
ranks that have not called it yet.

:func:`rendezvous_wait` reads that from the ranks' own ``K_WAIT`` records
(``hooks/rayhooks/ray_calls.py``), not from the actor: rank R has an open wait on an actor
method M (actor id, class, method); each of the ranks ``others`` called M before (a
``ray_wait`` record on M that began before R's open wait and has returned) and none waits
on M now. Then R waits at M for them: they have not reached it. A rank that never called M,
or waits on it too, is not behind there (M is no rendezvous of theirs, or they are at it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

from hangtrace.tracer.analyze.actors.actorgraph import Target, open_waits, targets_of
from hangtrace.tracer.analyze.context import Ctx, history
from hangtrace.tracer.ring.summary import record_key


@dataclass(frozen=True)
class Rendezvous:
    """Rank ``rank`` waits at actor method ``target`` (since ``since_wall_ns``, ns since the
    epoch, on thread ``thread``) for ``behind``: ranks whose newest call of it returned
    before that wait began (``their_last_wall_ns``: rank -> when that call began)."""

    rank: int
    target: Target
    thread: str
    since_wall_ns: int
    behind: Tuple[int, ...]
    their_last_wall_ns: Mapping[int, int]

    def details(self) -> Dict[str, Any]:
        """JSON-able: the waiting rank, the actor method, since when, the ranks behind."""
        return {
            "rank": self.rank,
            "actor_id": self.target.actor_id,
            "method": self.target.text(),
            "thread": self.thread,
            "since_wall_ns": self.since_wall_ns,
            "behind": list(self.behind),
        }


def _calls(ctx: Ctx, r: int, target: Target) -> List[Mapping[str, Any]]:
    """Rank ``r``'s ray_wait records on ``target`` that the snapshot keeps, oldest first."""
    v = ctx.views.get(r)
    if v is None:
        return []
    recs = list(history(v.proc)) + list(v.proc.summary.waits.values() if v.proc.summary else ())
    seen: Dict[Any, Mapping[str, Any]] = {}
    for x in recs:
        if x.get("kind") == "ray_wait" and target in targets_of(x):
            seen.setdefault(record_key(x), x)
    return sorted(seen.values(), key=lambda x: int(x.get("t_wall_ns") or 0))


def rendezvous_wait(ctx: Ctx, rank: int, others: Iterable[int]) -> Optional[Rendezvous]:
    """Rank ``rank``'s open wait at an actor method every one of ``others`` has not reached
    (module docstring), or None. The oldest such wait when it has several."""
    v = ctx.views.get(rank)
    others = sorted(set(others) - {rank})
    if v is None or not others:
        return None
    for w in open_waits(v.proc):
        if w.stopped or len(w.targets) != 1:  # a ray.wait on several refs is no rendezvous
            continue
        t = w.targets[0]
        last: Dict[int, int] = {}
        for o in others:
            calls = _calls(ctx, o, t)
            if not calls or any(c.get("state") == "issued" for c in calls):
                break
            began = int(calls[-1].get("t_wall_ns") or 0)
            if not began or began >= w.since_wall_ns:
                break
            last[o] = began
        else:
            return Rendezvous(rank, t, w.thread, w.since_wall_ns, tuple(others), last)
    return None
