"""Rule *broken_order* -> 'skipped-collective', cause 'skipped' (an apparent cycle explained
by a minority that broke the order in which every rank had interleaved two groups, and then
went on to a later step; checked after *left_phase*, before *deadlock*).

``analyze/graph/grouporder.py`` finds the broken order: until the hang every rank issued one group's
collectives at the same places among another group's, and a minority went from the other
group's stream on without the collective its peers wait in. When that minority records a
later step than its waiters (``grouporder.moved_on``), it skipped that collective: this rule.
Without steps the records cannot tell a skip from groups entered in another order on this
step only: rule *deadlock* then names the cycle and says the order was broken.

Found by a blind job (helper 85, 2026-12-04): 4 ranks, DDP on the default group, an eval
``all_reduce`` and ``barrier`` every 5 steps on a group of their own; at step 10 rank 3's
``compute_accuracy`` raised ZeroDivisionError, an ``except ...: continue`` skipped both, and it
went into the next step's backward (DDP's all-reduce on the default group). The verdict was
"cross-group deadlock" with the advice to enter the groups in one order.
"""

from __future__ import annotations

from typing import Optional

from hangtrace.tracer.analyze.context import Ctx
from hangtrace.tracer.ring.frrecords import FR_SOURCE
from hangtrace.tracer.analyze.evidence import fill_common, rk, vb
from hangtrace.tracer.analyze.graph.grouporder import Broken, find_broken, moved_on, to_details
from hangtrace.tracer.analyze.rules.base import Finding
from hangtrace.tracer.analyze.graph.skippedcall import own_call
from hangtrace.tracer.analyze.graph.waitgraph import inst_text
from hangtrace.tracer.diagnosis import Cause, Diagnosis, Kind

NAME = "broken_order"


def find(ctx: Ctx) -> Optional[Finding]:
    """The instance a minority skipped by breaking the agreed order and moving on to a later
    step (``data``: a ``grouporder.Broken``), or None."""
    b = find_broken(ctx)
    if b is None or not moved_on(ctx, b):
        return None
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
    d.details["broken_order"] = dict(to_details(b), op=op)
    reasons = d.details.setdefault("culprit_reasons", {})
    for r in b.side:
        x = ctx.blocked(r)
        last = ctx.views[r].last.get(inst.group)
        torch_own = x.get("source") == FR_SOURCE
        reasons[str(r)] = (
            "it went on without it to step %s (its last collective on that group: %s seq %s) into %s seq %s on %s%s; "
            "until "
            "then every rank had issued that group's collectives (seq %s) at the same places among those of group "
            "'%s'"
            % (
                ctx.views[r].step,
                last.get("op") if last else "none",
                last.get("seq") if last else "-",
                x.get("op"),
                x.get("seq"),
                ctx.gdesc(b.other),
                ", a collective torch issued itself (DDP's gradient all-reduce in backward, or "
                "another C++ collective)"
                if torch_own
                else "",
                ", ".join(str(j) for j in b.agreed[-4:]),
                b.other,
            )
        )
        ctx.add("rank %d: %s" % (r, reasons[str(r)]))
    ctx.add(
        "%s %s in %s (%s%s) for %s"
        % (
            rk(inst.waiters, 8),
            vb(inst.waiters),
            inst_text(ctx, inst),
            op,
            ", call %s by the program's own count" % next(iter(calls))
            if len(calls) == 1 and None not in calls
            else "",
            rk(b.side, 8),
        )
    )
    ctx.add(
        "not a cross-group deadlock: until then every rank interleaved the two groups alike; %s broke that "
        "order (a branch taken on %s only: an exception caught and passed over, an empty batch)"
        % (rk(b.side, 8), "it" if len(b.side) == 1 else "them")
    )
