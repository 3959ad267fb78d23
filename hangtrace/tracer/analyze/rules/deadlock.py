"""Rule *deadlock* -> 'cross-group-deadlock', cause 'cycle'.

Tarjan's SCC over the wait-for graph: a cycle of ranks waiting on each other through
instances of two or more groups (or p2p), not explained by an extra collective (rule
*extra_collective*, checked first). Culprits: every rank of the (largest) cycle, except
when one side of the cycle is a strict minority, counting every rank waiting in each
side's instance, in the cycle or not (e.g. rank 0 alone in a world barrier while 1..7
wait in a DP all_reduce for it; or ranks 0 and 2 in group A against rank 1 alone in
group B, 3 ranks that created their groups in different orders): then that minority
diverged and is named; the whole cycle stays in ``details['cycle']``.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from hangtrace.tracer.analyze.context import Ctx
from hangtrace.tracer.analyze.graph.grouporder import find_broken, to_details
from hangtrace.tracer.analyze.evidence import fill_common, rk, vb
from hangtrace.tracer.analyze.rules.base import Finding
from hangtrace.tracer.analyze.stuck.stacktree import format_ranks
from hangtrace.tracer.analyze.graph.waitgraph import cycles, inst_text
from hangtrace.tracer.diagnosis import Cause, Diagnosis, Kind

NAME = "deadlock"


def find(ctx: Ctx) -> Optional[Finding]:
    """The largest cycle (``data``: (cycle instances, number of cycles)), or None."""
    cyc = cycles(ctx)
    if not cyc.sccs:
        return None
    return Finding(
        NAME,
        cyc.ranks,
        min([i.start for i in cyc.insts if i.start] or [0]),
        data=(list(cyc.insts), len(cyc.sccs)),
    )


def explain(ctx: Ctx, finding: Finding, d: Diagnosis) -> None:
    """Who waits where for whom in the cycle; the minority side when there is one;
    ``details['cycle']``, ``details['groups']``."""
    ranks = list(finding.culprits)
    cinsts, ncycles = finding.data
    parts: Dict[Any, List[int]] = {}
    for r in ranks:
        parts.setdefault(ctx.inst_of[r].key, []).append(r)
    # a side's weight: every rank waiting in its instance, in the cycle or not (rank 2
    # waiting beside rank 0 sides with rank 0 against rank 1, which alone took the other order)
    weight = {k: len(ctx.inst_of[rs[0]].waiters) or len(rs) for k, rs in parts.items()}
    sizes = sorted(weight.values())
    culprits = ranks
    minority: Optional[List[int]] = None
    if len(sizes) > 1 and sizes[0] < sizes[1]:
        minority = parts[min(weight, key=lambda k: weight[k])]
        culprits = minority
    d.kind = Kind.CROSS_GROUP_DEADLOCK
    d.cause = Cause.CYCLE
    fill_common(ctx, d, culprits, ctx.inst_of[culprits[0]])
    groups = sorted({i.group for i in cinsts})
    d.details["cycle"] = {
        "ranks": ranks,
        "groups": groups,
        "instances": [
            {
                "group": i.group,
                "seq": i.seq,
                "waiters": sorted(i.waiters),
                "missing": sorted(i.missing),
                "p2p": i.p2p,
            }
            for i in cinsts
        ],
    }
    d.details["groups"] = groups
    for _key, rs in sorted(parts.items(), key=lambda kv: len(kv[1])):
        i = ctx.inst_of[rs[0]]
        ctx.add(
            "%s %s in %s (%s) for %s"
            % (rk(rs, 8), vb(rs), inst_text(ctx, i), ctx.blocked(rs[0]).get("op"), rk(i.missing, 8))
        )
    ctx.add(
        "the waits form a cycle over %s: each side holds what the other needs "
        "(groups entered in different orders)" % ", ".join("'%s'" % g for g in groups)
    )
    if minority is not None:
        ctx.add(
            "%s: the minority side of the cycle, diverged from the others (cycle ranks %s)"
            % (rk(minority, 8), format_ranks(ranks, 8))
        )
    if ncycles > 1:
        ctx.add("%d separate cycles; the largest is shown" % ncycles)
    b = find_broken(ctx)  # analyze/graph/grouporder.py: until now every rank interleaved the groups alike
    if b is not None:
        d.details["broken_order"] = dict(to_details(b), op=ctx.blocked(b.inst.waiters[0]).get("op"))
        ctx.add(
            "until then every rank had issued group '%s''s collectives (seq %s) at the same places among group "
            "'%s''s; %s broke that order here: %s skipped %s seq %s on group '%s' or entered the groups in "
            "another order on this step"
            % (
                b.inst.group,
                ", ".join(str(j) for j in b.agreed[-4:]),
                b.other,
                rk(b.side, 8),
                "it" if len(b.side) == 1 else "they",
                ctx.blocked(b.inst.waiters[0]).get("op"),
                b.inst.seq,
                b.inst.group,
            )
        )
