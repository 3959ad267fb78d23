"""Rule *left_phase* -> 'skipped-collective', cause 'skipped' (an apparent cycle explained by
a side that went through the phase of its peers' collective without it; checked before
*deadlock*).

In a cycle of the wait-for graph, one side waits in an instance of group A while the other
side waits in an instance I of group B that the first side never issued. When the others
issued I inside phase P (their waiting records' phase), and every rank of the first side
entered and left P after its newest collective on B (a whole visit of P without it:
``RingSummary.phase_visits``) and now waits in another phase, that side skipped I: a
data-dependent branch (an empty micro-batch list, a ``continue``) took it past the
collective, and it will not come back for it. A genuine cross-group deadlock has every
rank issue both collectives in different orders: no rank leaves the phase of the other
side's collective without issuing it, so this rule stays silent (and so it does without
phases: ``tracer.phase`` or Ray actor methods give them).

Found by a blind job (ray_slow_start_skip, 2026-12-03): trainer 2 got no micro-batch at
step 3, skipped its gradient all_reduces on 'train' and waited in the weight broadcast;
the verdict was 'cross-group deadlock' with the advice to enter the groups in one order.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

from hangtrace.tracer.analyze.context import Ctx
from hangtrace.tracer.analyze.evidence import fill_common, rk, vb
from hangtrace.tracer.analyze.rules.base import Finding
from hangtrace.tracer.analyze.graph.waitgraph import Inst, cycles, inst_text
from hangtrace.tracer.diagnosis import Cause, Diagnosis, Kind

NAME = "left_phase"


def skipped_in(ctx: Ctx, ranks: List[int], inst: Inst) -> Optional[str]:
    """The phase P in which ``inst``'s waiters issued it, when every rank of ``ranks``
    entered and left P after its newest collective on ``inst.group`` and now waits in
    another phase; else None."""
    if inst.p2p or not inst.waiters:
        return None
    phases = {ctx.blocked(w).get("phase") for w in inst.waiters}
    if len(phases) != 1:
        return None
    phase = phases.pop()
    if not phase:
        return None
    for r in ranks:
        v = ctx.views.get(r)
        if v is None or v.blocked is None or v.blocked.get("phase") == phase or v.proc.summary is None:
            return None
        last = v.last.get(inst.group)
        enter, leave = v.proc.summary.phase_visits.get(phase, (None, None))
        if enter is None or leave is None or not (last["idx"] if last else 0) < enter["idx"] < leave["idx"]:
            return None
    return str(phase)


def find(ctx: Ctx) -> Optional[Finding]:
    """The one side of the largest cycle that skipped the other side's collective
    (``data``: (that instance, the phase)), or None."""
    cyc = cycles(ctx)
    if not cyc.sccs:
        return None
    found: List[Tuple[Inst, List[int], str]] = []
    for inst in cyc.insts:
        side = sorted(r for r in cyc.ranks if r in inst.missing)
        phase = skipped_in(ctx, side, inst) if side else None
        if phase is not None:
            found.append((inst, side, phase))
    if len(found) != 1:
        return None
    inst, side, phase = found[0]
    return Finding(NAME, tuple(side), inst.start or 0, data=(inst, phase))


def explain(ctx: Ctx, finding: Finding, d: Diagnosis) -> None:
    """The skipped instance, the phase the culprits went through without it, where they
    wait now; ``details['culprit_reasons']``, ``details['skipped_in_phase']``."""
    inst, phase = finding.data
    side = list(finding.culprits)
    d.kind, d.cause = Kind.SKIPPED_COLLECTIVE, Cause.SKIPPED
    fill_common(ctx, d, side, inst)
    d.details["skipped_in_phase"] = phase
    reasons = d.details.setdefault("culprit_reasons", {})
    for r in side:
        b = ctx.blocked(r)
        last = ctx.views[r].last.get(inst.group)
        reasons[str(r)] = (
            "it went through phase '%s' without it (its last collective on that group: seq %s) and "
            "waits in %s seq %s on group '%s' at phase '%s'"
            % (
                phase,
                last.get("seq") if last else "none",
                b.get("op"),
                b.get("seq"),
                b.get("group"),
                b.get("phase"),
            )
        )
        ctx.add("rank %d: %s" % (r, reasons[str(r)]))
    ctx.add(
        "%s %s in %s (%s) for %s, issued in phase '%s'"
        % (
            rk(inst.waiters, 8),
            vb(inst.waiters),
            inst_text(ctx, inst),
            ctx.blocked(inst.waiters[0]).get("op"),
            rk(side, 8),
            phase,
        )
    )
    ctx.add(
        "not a cross-group deadlock: %s left phase '%s' without the collective the others wait in there, "
        "so it will not issue it later" % (rk(side, 8), phase)
    )
