"""Rule *idle* -> 'progressing', or 'unknown' with cause 'stalled-inside-collective' /
'stalled-outside-collectives' (the fallback: always finds).

Everybody at the frontier: if waiting ranks exist but every instance has all its
members (a collective in progress), the run is 'progressing' when the last progress
anywhere is younger than ``stall_s`` (default 300 s) and the snapshot reason is not
'stall'; otherwise 'unknown' (a transport-level or in-kernel stall). No rank waiting at
all -> 'progressing' (or 'unknown' if stalled: nobody is in a collective).
"""
from __future__ import annotations

from typing import Optional

from hangtrace.tracer.analyze.context import Ctx
from hangtrace.tracer.analyze.evidence import fill_common, stall_note
from hangtrace.tracer.analyze.rules.base import Finding
from hangtrace.tracer.analyze.stacktree import format_ranks
from hangtrace.tracer.analyze.waitgraph import inst_text
from hangtrace.tracer.diagnosis import Cause, Diagnosis, Kind

NAME = "idle"


def find(ctx: Ctx) -> Optional[Finding]:
    """Always a Finding (``data``: the busiest instance or None)."""
    busy = sorted(ctx.insts.values(), key=lambda i: -len(i.waiters))[0] if ctx.insts else None
    return Finding(NAME, data=busy)


def explain(ctx: Ctx, finding: Finding, d: Diagnosis) -> None:
    """Progressing or stalled, inside or outside collectives; the stall note."""
    busy = finding.data
    note = stall_note(ctx)
    if busy is not None and not ctx.stalled:
        d.kind = Kind.PROGRESSING
        d.cause = None
        ctx.add("every waiting rank is in a collective all its members entered (e.g. %s, ranks %s)"
                % (inst_text(ctx, busy), format_ranks(busy.waiters, 8)))
    elif busy is not None:
        d.kind = Kind.UNKNOWN
        d.cause = Cause.STALLED_INSIDE_COLLECTIVE
        fill_common(ctx, d, [], busy)
        ctx.add("all members of %s entered it (ranks %s) and it does not complete: a transport or "
                "in-kernel stall; take native stacks (py-spy --native) of these ranks"
                % (inst_text(ctx, busy), format_ranks(busy.waiters, 8)))
    elif not ctx.stalled:
        d.kind = Kind.PROGRESSING
        ctx.add("no rank is blocked in a collective or p2p op")
    else:
        d.kind = Kind.UNKNOWN
        d.cause = Cause.STALLED_OUTSIDE_COLLECTIVES
        ctx.add("no rank is in a collective, yet nothing progressed: every rank waits outside "
                "collectives (queue, IO, Ray); see the stack classes")
        for c in [c for c in d.stack_classes if c.get("outlier")][:3]:
            ctx.add("outlier stack (ranks %s): %s" % (format_ranks(c["ranks"], 8), " > ".join(c["frames"][-3:])))
    if note:
        ctx.add(note)
