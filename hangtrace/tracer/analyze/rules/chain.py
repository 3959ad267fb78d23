"""Rule *chain* -> the kind of the chain end most waiters wait for: 'dead-rank',
'skipped-collective' (cause 'skipped'), or 'stuck-outside-collective' (cause 'blocked'
or 'no-progress').

Following edges from every waiting rank, the ranks reached that are not waiting
themselves are the culprits, each classified as ``analyze/stuck/chainends.py`` describes
(dead, exited cleanly, inside an untraced collective, blocked outside collectives,
moved on, or no progress). The main instance is the first collective a chain end failed
to join (earliest wait start; in program order the others block there first), then the
one with the most waiters. Rule *minority* (checked first) turns the verdict around
when the waiters are the minority that diverged.
"""

from __future__ import annotations

from typing import Optional

from hangtrace.tracer.analyze.actors.actorreturn import returned_method
from hangtrace.tracer.analyze.stuck.chainends import ChainEnds, chain_ends
from hangtrace.tracer.analyze.context import Ctx
from hangtrace.tracer.analyze.evidence import fill_common, frames_of, rank_line, rk, seq_scales, vb
from hangtrace.tracer.analyze.rules.base import Finding
from hangtrace.tracer.analyze.stuck.stacktree import format_ranks
from hangtrace.tracer.analyze.graph.waitgraph import Inst, chain, chain_text
from hangtrace.tracer.diagnosis import Cause, Diagnosis, Kind

NAME = "chain"
_INF = float("inf")


def main_instance(ce: ChainEnds) -> Optional[Inst]:
    """The first instance a chain end failed to join (earliest start, then most waiters)."""
    main: Optional[Inst] = None
    for e in ce.present:
        for i in ce.insts_for.get(e, ()):
            if main is None or (i.start or _INF, -len(i.waiters)) < (main.start or _INF, -len(main.waiters)):
                main = i
    return main


def chain_finding(ctx: Ctx, name: str) -> Optional[Finding]:
    """The chain ends with a process as a Finding of rule ``name`` (culprits: the ends;
    ``end_kinds``: their kinds), or None when there is none."""
    ce = chain_ends(ctx)
    if not ce.present:
        return None
    start = min([i.start for e in ce.present for i in ce.insts_for.get(e, ()) if i.start] or [0])
    return Finding(name, ce.present, start, end_kinds={e: k for e, (k, _why) in ce.kinds.items()}, data=ce)


def find(ctx: Ctx) -> Optional[Finding]:
    """The chain ends with a process (``data``: the ChainEnds), or None."""
    return chain_finding(ctx, NAME)


def explain(ctx: Ctx, finding: Finding, d: Diagnosis) -> None:
    """The lead end's kind; per end its last collective, reason and stack; the wait
    chain; ``details['culprit_kinds']``, ``['culprit_reasons']``, ``['direct_waiters']``."""
    ce: ChainEnds = finding.data
    ends, kinds = list(ce.present), ce.kinds
    main = main_instance(ce)
    # kind: the kind of the end the most waiters wait for
    weight = {e: sum(len(i.waiters) for i in ce.insts_for.get(e, ())) for e in ends}
    lead = max(ends, key=lambda e: (weight[e], -e))
    d.kind = Kind(kinds[lead][0])
    if d.kind == Kind.DEAD_RANK:
        d.cause = ctx.views[lead].cause
    fill_common(ctx, d, ends, main)
    if main is not None:
        d.details["direct_waiters"] = sorted(main.waiters)
    d.details["culprit_kinds"] = {str(e): kinds[e][0] for e in ends}
    d.details["culprit_reasons"] = {str(e): kinds[e][1] for e in ends}
    if d.kind == Kind.SKIPPED_COLLECTIVE and d.cause is None:
        d.cause = Cause.SKIPPED
        ret = returned_method(ctx, lead)  # an actor method that returned (analyze/actors/actorreturn.py)
        if ret is not None:
            d.details["returned"] = ret.details()
    elif d.kind == Kind.STUCK_OUTSIDE_COLLECTIVE:
        d.cause = (
            Cause.BLOCKED
            if kinds[lead][1].startswith("blocked")
            else Cause.BUSY
            if kinds[lead][1].startswith("busy")
            else Cause.NO_PROGRESS
        )
    if main is not None:
        for e in ends[:6]:
            ctx.add(
                rank_line(ctx, e, main.group)
                + "; %s %s at %s (%s)%s"
                % (
                    rk(main.waiters, 8),
                    vb(main.waiters),
                    "seq %s" % main.seq if not main.p2p else "pair seq %s" % main.seq,
                    ctx.blocked(main.waiters[0]).get("op"),
                    seq_scales(ctx, e, main.group, main.waiters),
                )
                if main.waiters
                else rank_line(ctx, e, main.group)
            )
    for e in ends[:6]:
        ctx.add("rank %d: %s" % (e, kinds[e][1]))
        labels, _f, _a = frames_of(ctx, e)
        if labels:
            ctx.add("rank %d stack (innermost first): %s" % (e, " < ".join(labels[:4])))
    if len(ends) > 6:
        ctx.add("... and %d more chain-end ranks: %s" % (len(ends) - 6, format_ranks(ends[6:], 8)))
    ch = chain(ctx, lead)
    if len(ch) > 2:
        ctx.add(chain_text(ctx, ch))
    if ce.nofile:
        ctx.add("%s: waited for too, but left no record file" % rk(ce.nofile, 8))
    if len(set(k for k, _ in kinds.values())) > 1:
        ctx.add("chain ends differ in kind: %s" % ", ".join("%d=%s" % (e, kinds[e][0]) for e in ends[:8]))
