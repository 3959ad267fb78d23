"""Rule *transport* -> 'transport-error', cause 'transport-error'.

Failed collective/p2p records with no dead rank and no hang: the first rank(s) to fail
(by failure time; ties all named) are the culprits, the rest are cascade.
"""

from __future__ import annotations

from typing import Optional

from hangtrace.tracer.analyze.context import Ctx
from hangtrace.tracer.analyze.failures.deaths import failures
from hangtrace.tracer.analyze.evidence import fill_common
from hangtrace.tracer.analyze.rules.base import Finding
from hangtrace.tracer.analyze.stuck.stacktree import format_ranks
from hangtrace.tracer.diagnosis import Cause, Diagnosis, Kind

NAME = "transport"


def find(ctx: Ctx) -> Optional[Finding]:
    """The first failure(s) (``data``: every failure, by time), or None."""
    fails = failures(ctx)
    if not fails:
        return None
    t0 = fails[0]["wall_ns"]
    return Finding(NAME, tuple(c["rank"] for c in fails if c["wall_ns"] == t0), t0, data=fails)


def explain(ctx: Ctx, finding: Finding, d: Diagnosis) -> None:
    """The first failure's text and the ranks that failed later; ``details['cause_text']``."""
    fails = finding.data
    first = fails[0]
    culprits = list(finding.culprits)
    d.kind = Kind.TRANSPORT_ERROR
    fill_common(ctx, d, culprits, None)
    rec = first if first.get("op") else (ctx.views[first["rank"]].failed or {})
    d.group, d.seq, d.op = rec.get("group"), rec.get("seq"), rec.get("op")
    if d.group is not None:
        d.group_ranks = list(ctx.members(d.group)) or None
    d.cause = Cause.TRANSPORT_ERROR
    d.details["cause_text"] = first["text"]
    where = (
        "%s on %s seq %s" % (d.op, ctx.gdesc(d.group), d.seq)
        if d.op
        else "its %s (no failed collective recorded)" % (first.get("cause") or "failure")
    )
    ctx.add("rank %d failed first: %s: %s" % (first["rank"], where, (first["text"] or "")[:200]))
    d.cascade = [c for c in fails if c["rank"] not in culprits]
    if d.cascade:
        ctx.add(
            "%d more rank(s) failed later: %s"
            % (len(d.cascade), format_ranks([c["rank"] for c in d.cascade], 12))
        )
    ctx.add(
        "no rank is dead: the transport (network, peer socket, timeout) failed; check the hosts' network "
        "and the peer named in the error"
    )
