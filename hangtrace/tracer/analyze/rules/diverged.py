"""Rule *diverged* -> 'collective-mismatch', cause 'sequence-diverged'.

No chain end has a process, but ranks are blocked in an instance whose only other
members are *ahead* (they already passed that seq): the sequence of collectives on this
group diverged (an extra or missing collective earlier on it). The blocked ranks are named.
"""

from __future__ import annotations

from typing import Optional

from hangtrace.tracer.analyze.stuck.chainends import chain_ends
from hangtrace.tracer.analyze.context import Ctx
from hangtrace.tracer.analyze.evidence import fill_common, rank_line, rk, vb
from hangtrace.tracer.analyze.rules.base import Finding
from hangtrace.tracer.analyze.graph.waitgraph import inst_text
from hangtrace.tracer.diagnosis import Cause, Diagnosis, Kind

NAME = "diverged"


def find(ctx: Ctx) -> Optional[Finding]:
    """The diverged ranks, when no chain end has a process."""
    ce = chain_ends(ctx)
    if ce.present or not ce.diverged:
        return None
    rs = ce.diverged
    return Finding(NAME, rs, min([ctx.inst_of[r].start for r in rs if ctx.inst_of[r].start] or [0]))


def explain(ctx: Ctx, finding: Finding, d: Diagnosis) -> None:
    """Where the named ranks wait and which members already passed it."""
    rs = list(finding.culprits)
    inst = ctx.inst_of[rs[0]]
    d.kind = Kind.COLLECTIVE_MISMATCH
    d.cause = Cause.SEQUENCE_DIVERGED
    fill_common(ctx, d, rs, inst)
    ctx.add(
        "%s %s at %s (%s), which %s already passed: their sequence numbers diverged "
        "(an extra or missing collective earlier on this group)"
        % (rk(rs, 8), vb(rs), inst_text(ctx, inst), ctx.blocked(rs[0]).get("op"), rk(inst.ahead, 8))
    )
    for a in inst.ahead[:3]:
        ctx.add(rank_line(ctx, a, inst.group))
