"""Rule *no_record_file* -> 'unknown', cause 'no-record-file'.

Ranks without a process are chain ends too; they are named only when no rank with a
process is a chain end and no rank's sequence numbers diverged: the ranks everyone
waits for left no record file (not traced, or file lost), so their state is unknown.
"""

from __future__ import annotations

from typing import Optional

from hangtrace.tracer.analyze.stuck.chainends import chain_ends
from hangtrace.tracer.analyze.context import Ctx
from hangtrace.tracer.analyze.evidence import fill_common, rk, vb
from hangtrace.tracer.analyze.rules.base import Finding
from hangtrace.tracer.analyze.graph.waitgraph import inst_text
from hangtrace.tracer.diagnosis import Cause, Diagnosis, Kind

NAME = "no_record_file"


def find(ctx: Ctx) -> Optional[Finding]:
    """The chain ends without a record file, when they are the only chain ends."""
    ce = chain_ends(ctx)
    if ce.present or ce.diverged or not ce.nofile:
        return None
    return Finding(NAME, ce.nofile, min([i.start for i in ctx.insts.values() if i.start] or [0]))


def explain(ctx: Ctx, finding: Finding, d: Diagnosis) -> None:
    """Who waits where for the ranks without a file."""
    d.kind = Kind.UNKNOWN
    d.cause = Cause.NO_RECORD_FILE
    culprits = set(finding.culprits)
    inst = max((i for i in ctx.insts.values() if set(i.missing) & culprits), key=lambda i: len(i.waiters))
    fill_common(ctx, d, finding.culprits, inst)
    ctx.add(
        "%s %s at %s (%s) for %s, which left no record file: state unknown "
        "(not traced, or file lost); check them directly"
        % (
            rk(inst.waiters),
            vb(inst.waiters),
            inst_text(ctx, inst),
            ctx.blocked(inst.waiters[0]).get("op"),
            rk(finding.culprits),
        )
    )
