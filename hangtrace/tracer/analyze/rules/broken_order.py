"""Rule *broken_order* -> 'skipped-collective', cause 'skipped' (an apparent cycle explained
by a minority that broke the order in which every rank had interleaved two groups; checked
after *left_phase*, before *deadlock*).

In a cycle of the wait-for graph, the waiters W of an instance I (group B, seq b) wait for a
side S that never issued it (S is behind on B) and waits in one instance of another group A.
When

1. S is a strict minority of S and W together;
2. S's collective on A is of a kind the ranks issued on A before (same signature: A's steady
   stream, such as the next step's gradient all-reduce; a collective only S adds, such as a
   rank-0-only checkpoint barrier, is an extra collective and left to *deadlock*);
3. before that, every rank of S and W issued each earlier collective of B that the snapshot
   keeps of all of them at the same place among its collectives on A (for each earlier seq j
   of B: the same newest seq of A before it), at least once - the ranks agreed on how the two
   groups interleave;

then S broke that order: it skipped B seq b and went on into A (a data-dependent branch: an
exception caught with ``continue``, an empty shard), rather than all ranks entering the
groups in opposite orders. A genuine cross-group deadlock shows the first time the two groups
meet (nothing agreed before it), or splits the ranks evenly; then this rule stays silent, and
so it does when the snapshot keeps no earlier collective of B on some rank.

Found by a blind job (helper 85, 2026-12-04): 4 ranks, DDP on the default group, an eval
``all_reduce`` and ``barrier`` every 5 steps on a group of their own; at step 10 rank 3's
``compute_accuracy`` raised ZeroDivisionError, an ``except ...: continue`` skipped both, and it
went into the next step's backward (DDP's all-reduce on the default group). The verdict was
"cross-group deadlock" with the advice to enter the groups in one order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional

from hangtrace.tracer.analyze.context import FR_SOURCE, Ctx, history
from hangtrace.tracer.analyze.evidence import fill_common, rk, vb
from hangtrace.tracer.analyze.rules.base import Finding
from hangtrace.tracer.analyze.skippedcall import own_call
from hangtrace.tracer.analyze.waitgraph import Inst, cycles, inst_text, signature
from hangtrace.tracer.diagnosis import Cause, Diagnosis, Kind

NAME = "broken_order"


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
            if x.get("kind") == "collective" and x.get("group") == a and isinstance(seq, int) and seq < a_seq \
                    and signature(x) == sig:
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


def find(ctx: Ctx) -> Optional[Finding]:
    """The one instance of the largest cycle a minority skipped by breaking the agreed order
    (``data``: a ``Broken``), or None."""
    cyc = cycles(ctx)
    if not cyc.sccs:
        return None
    found = [b for b in (_broken(ctx, i, list(cyc.ranks)) for i in cyc.insts) if b is not None]
    if len(found) != 1:
        return None
    b = found[0]
    return Finding(NAME, tuple(b.side), b.inst.start or 0, data=b)


def explain(ctx: Ctx, finding: Finding, d: Diagnosis) -> None:
    """The skipped instance, where its skippers wait now and the order they broke;
    ``details['culprit_reasons']``, ``details['broken_order']``."""
    b: Broken = finding.data
    inst = b.inst
    d.kind, d.cause = Kind.SKIPPED_COLLECTIVE, Cause.SKIPPED
    fill_common(ctx, d, b.side, inst)
    op = ctx.blocked(inst.waiters[0]).get("op")
    calls = {own_call(ctx.blocked(w)) for w in inst.waiters}
    d.details["broken_order"] = {"group": inst.group, "seq": inst.seq, "op": op, "other_group": b.other,
                                 "other_seq": b.other_seq, "agreed": b.agreed[-6:]}
    reasons = d.details.setdefault("culprit_reasons", {})
    for r in b.side:
        x = ctx.blocked(r)
        last = ctx.views[r].last.get(inst.group)
        torch_own = x.get("source") == FR_SOURCE
        reasons[str(r)] = (
            "it went on without it (its last collective on that group: %s seq %s) into %s seq %s on %s%s; until "
            "then every rank had issued that group's collectives (seq %s) at the same places among those of group "
            "'%s'" % (
                last.get("op") if last else "none", last.get("seq") if last else "-", x.get("op"), x.get("seq"),
                ctx.gdesc(b.other), ", a collective torch issued itself (DDP's gradient all-reduce in backward, or "
                "another C++ collective)" if torch_own else "", ", ".join(str(j) for j in b.agreed[-4:]), b.other))
        ctx.add("rank %d: %s" % (r, reasons[str(r)]))
    ctx.add("%s %s in %s (%s%s) for %s" % (
        rk(inst.waiters, 8), vb(inst.waiters), inst_text(ctx, inst), op,
        ", call %s by the program's own count" % next(iter(calls)) if len(calls) == 1 and None not in calls else "",
        rk(b.side, 8)))
    ctx.add("not a cross-group deadlock: until then every rank interleaved the two groups alike; %s broke that "
            "order (a branch taken on %s only: an exception caught and passed over, an empty batch)" % (
                rk(b.side, 8), "it" if len(b.side) == 1 else "them"))
