"""Rule *silent_mismatch* -> 'collective-mismatch', cause 'mismatch', ``details['silent']``.

Nobody waits and nobody died (a fallback rule), yet the ranks' *completed* records at one
(group, seq) carry different signatures (``analyze/sigclasses.first_divergence``): gloo
completed a collective whose sizes or dtypes disagree (a broadcast into a larger buffer
writes only the root's bytes), so a rank ran on with wrong data. Blind job of 2026-12-02:
one rank's (4, 4) table resized to (4, 5) before ``broadcast(src=0)``; the job exited 0 and
was called "progressing". The culprits are who changed (``sigclasses.changed``: the
minority, else the one signature new on the group, else every rank). Tried first among
the fallback rules: a failure later is more likely its consequence than a root.
"""

from __future__ import annotations

from typing import Optional

from hangtrace.tracer.analyze.graph import sigclasses
from hangtrace.tracer.analyze.context import Ctx
from hangtrace.tracer.analyze.evidence import fill_common
from hangtrace.tracer.analyze.rules.base import Finding
from hangtrace.tracer.diagnosis import Cause, Diagnosis, Kind

NAME = "silent_mismatch"


def find(ctx: Ctx) -> Optional[Finding]:
    """The earliest silently completed mismatch (``data``: (group, seq, records, culprits,
    how)), or None."""
    div = sigclasses.first_divergence(ctx)
    if div is None:
        return None
    g, seq, recs = div
    culprits, how = sigclasses.changed(ctx, g, seq, recs)
    t = min(int(x.get("t_wall_ns") or 0) for x in recs.values())
    return Finding(NAME, tuple(culprits), t, data=(g, seq, recs, culprits, how))


def explain(ctx: Ctx, finding: Finding, d: Diagnosis) -> None:
    """Every signature with its ranks; ``details['signatures']``, ``['silent']``."""
    g, seq, recs, culprits, how = finding.data
    d.kind, d.cause = Kind.COLLECTIVE_MISMATCH, Cause.MISMATCH
    fill_common(ctx, d, list(culprits), None)
    d.group, d.group_ranks, d.seq = g, list(ctx.members(g)) or None, seq
    d.op = recs[culprits[0]].get("op")
    sigclasses.at_call(d, recs[culprits[0]])
    d.details["silent"] = True
    d.details["group_desc"] = (ctx.groups.get(g) or {}).get("desc")
    d.details["signatures"] = sigclasses.describe(ctx, g, seq, recs, list(culprits), " (completed)")
    ctx.add(how)
    ctx.add(
        "the collective completed although the members disagree: gloo checks only that it does not receive "
        "more bytes than it expects, so the job ran on with wrong data from here"
    )
