"""Did a minority break the order in which every rank had interleaved two groups? (pure)

In a cycle of the wait-for graph, the waiters W of an instance I (group B, seq b) wait for a
side S that never issued it (S is behind on B) and waits in one instance of another group A.
The order is *broken* by S when

1. S is a strict minority of S and W together;
2. S's collective on A is of a kind the ranks issued on A before (same signature: A's steady
   stream, such as the next step's gradient all-reduce; a collective only S adds, such as a
   rank-0-only checkpoint barrier, is an extra collective);
3. before that, every rank of S and W issued each earlier collective of B that the snapshot
   keeps of all of them at the same place among its collectives on A (for each earlier seq j
   of B: the same newest seq of A before it), at least once: the ranks agreed on how the two
   groups interleave.

S then either skipped B seq b (a data-dependent branch: an exception caught with
``continue``, an empty shard) or entered the groups in another order on this step only (an
"overlap" switched on after warm-up); the records cannot tell these apart, a later step can:
``moved_on`` (S records a later step than W: it went on past B seq b). Groups entered in
opposite orders from the first time they meet, or an even split, are no broken order.

In: the context and the cycle. Out: ``Broken`` or None. Used by rule ``broken_order`` (a skip,
when S moved on) and rule ``deadlock`` (otherwise: ``details['broken_order']``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional

from hangtrace.tracer.analyze.context import Ctx, history
from hangtrace.tracer.analyze.graph.waitgraph import Inst, cycles, signature


@dataclass(frozen=True)
class Broken:
    """Instance ``inst`` (group B) skipped by ``side``, which waits in group ``other`` (A)
    at ``other_seq``; ``agreed``: the earlier seqs of B every rank placed alike among A's."""

    inst: Inst
    side: List[int]
    other: Any
    other_seq: int
    agreed: List[int]


def _places(ctx: Ctx, r: int, a: Any, b: Any) -> Dict[int, int]:
    """{seq j of group ``b``: the newest seq of group ``a`` rank ``r`` issued before it}."""
    v = ctx.views.get(r)
    out: Dict[int, int] = {}
    newest_a = 0
    for rec in history(v.proc) if v is not None else ():
        seq = rec.get("seq")
        if rec.get("kind") != "collective" or not isinstance(seq, int):
            continue
        if rec.get("group") == a:
            newest_a = max(newest_a, seq)
        elif rec.get("group") == b:
            out.setdefault(seq, newest_a)
    return out


def _regular(ctx: Ctx, ranks: List[int], a: Any, a_seq: int, rec: Mapping[str, Any]) -> bool:
    """Is ``rec`` (the side's collective on group ``a``, at ``a_seq``) of a kind the ranks
    issued on ``a`` before (the same signature at an earlier seq): the group's steady stream
    (the next step's gradient all-reduce), not a collective added on that side only (a
    rank-0-only checkpoint barrier: that is an extra collective, left to *deadlock*)?"""
    sig = signature(rec)
    for r in ranks:
        v = ctx.views.get(r)
        for x in history(v.proc) if v is not None else ():
            seq = x.get("seq")
            if (
                x.get("kind") == "collective"
                and x.get("group") == a
                and isinstance(seq, int)
                and seq < a_seq
                and signature(x) == sig
            ):
                return True
    return False


def _broken(ctx: Ctx, inst: Inst, cycle_ranks: List[int]) -> Optional[Broken]:
    side = sorted(r for r in cycle_ranks if r in inst.missing and r in inst.behind)
    waiters = list(inst.waiters)
    if inst.p2p or not side or not waiters or len(side) * 2 >= len(side) + len(waiters):
        return None
    blocked = [ctx.blocked(r) for r in side]
    others = {(x.get("group"), x.get("seq")) for x in blocked}
    if len(others) != 1:
        return None
    a, a_seq = others.pop()
    if a is None or a == inst.group or not isinstance(a_seq, int):
        return None
    if not _regular(ctx, side + waiters, a, a_seq, blocked[0]):
        return None
    places = {r: _places(ctx, r, a, inst.group) for r in side + waiters}
    agreed = sorted(j for j in set.intersection(*(set(p) for p in places.values())) if j < inst.seq)
    if not agreed or any(len({places[r][j] for r in places}) != 1 for j in agreed):
        return None
    return Broken(inst, side, a, a_seq, agreed)


def find_broken(ctx: Ctx) -> Optional[Broken]:
    """The one instance of the largest cycle whose order a minority broke (module
    docstring), or None (none, or more than one)."""
    cyc = cycles(ctx)
    if not cyc.sccs:
        return None
    found = [b for b in (_broken(ctx, i, list(cyc.ranks)) for i in cyc.insts) if b is not None]
    return found[0] if len(found) == 1 else None


def moved_on(ctx: Ctx, b: Broken) -> bool:
    """Every rank of ``b.side`` records a later step than every waiter of ``b.inst`` (the
    ``tracer.step`` API, Ray actor steps): it went on past the collective; False when a
    step is unknown."""
    steps_s = [ctx.views[r].step for r in b.side if r in ctx.views]
    steps_w = [ctx.views[w].step for w in b.inst.waiters if w in ctx.views]
    side = [s for s in steps_s if isinstance(s, int)]
    waiters = [s for s in steps_w if isinstance(s, int)]
    if not side or not waiters or len(side) < len(steps_s) or len(waiters) < len(steps_w):
        return False
    return min(side) > max(waiters)


def to_details(b: Broken) -> Dict[str, Any]:
    """``details['broken_order']``: the skipped instance, the side and where it waits."""
    return {
        "group": b.inst.group,
        "seq": b.inst.seq,
        "side": list(b.side),
        "waiters": sorted(b.inst.waiters),
        "other_group": b.other,
        "other_seq": b.other_seq,
        "agreed": b.agreed[-6:],
    }
