"""Rule *before_rendezvous* -> 'stuck-outside-collective': no process group was ever created,
some ranks are inside ``init_process_group`` (the rendezvous, waiting for the others) and
the others are blocked before it, so the rendezvous never completes.

Found by blind helper 59 (2026-12-04): four ranks built a shared cache under a file lock
(the ``filelock`` package), rank 0 called ``init_process_group`` inside the locked block,
ranks 1-3 waited for the lock before theirs: the verdict was "Unknown: nothing progressed
but no rank is in a collective". Rule *idle*'s rendezvous case needs every rank with a
stack inside the rendezvous; this is the other half: the ranks outside it are the
culprits, with what they wait for, and a rank in the rendezvous that holds a file lock
(its ``held_locks``, collect/filelocks.py) is named - it waits for the ranks that wait
for its lock.

A fallback rule (``rules.FALLBACK_RULES``, before *idle*): only when the run is stalled.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from hangtrace.tracer.analyze.stuck.blocking import blocking_reason, in_rendezvous_stack
from hangtrace.tracer.analyze.context import Ctx
from hangtrace.tracer.analyze.evidence import fill_common, frames_of, stall_note
from hangtrace.tracer.analyze.rules.base import Finding
from hangtrace.tracer.analyze.stuck.stacktree import format_ranks, pick_thread
from hangtrace.tracer.diagnosis import Cause, Diagnosis, Kind

NAME = "before_rendezvous"


def find(ctx: Ctx) -> Optional[Finding]:
    """``data``: (ranks inside the rendezvous, {rank outside: why}) when the run is stalled,
    no rank recorded a group or a collective, and both sets are non-empty; else None."""
    if not ctx.stalled:
        return None
    inside: List[int] = []
    outside: Dict[int, str] = {}
    for r, v in sorted(ctx.views.items()):
        if v.last or v.p2p or v.proc.groups or v.dead:
            return None
        if not v.proc.stacks:
            continue
        if in_rendezvous_stack(v.proc):
            inside.append(r)
            continue
        labels, frames, thread = frames_of(ctx, r)
        outside[r] = (
            blocking_reason(frames, thread=thread) if frames else None
        ) or "no known blocking call on its stack (%s)" % (labels[0] if labels else "no frame")
    if not inside or not outside:
        return None
    return Finding(NAME, tuple(outside), data=(inside, outside))


def _holders(ctx: Ctx, inside: List[int]) -> List[Tuple[int, List[str]]]:
    out = []
    for r in inside:
        th = pick_thread(ctx.views[r].proc.stacks)
        held = [str(x) for x in (th or {}).get("held_locks") or ()]
        if held:
            out.append((r, held))
    return out


def explain(ctx: Ctx, finding: Finding, d: Diagnosis) -> None:
    """Kind, cause, culprits (the ranks outside), waiting ranks (those inside), reasons, and
    ``details['rendezvous_lock']`` when a rank inside holds a file lock."""
    inside, outside = finding.data
    d.kind = Kind.STUCK_OUTSIDE_COLLECTIVE
    d.cause = Cause.BLOCKED
    fill_common(ctx, d, list(outside), None)
    d.waiting_ranks = list(inside)
    d.details["culprit_reasons"] = {
        str(r): "it never reached init_process_group: %s" % why for r, why in outside.items()
    }
    d.details["culprit_kinds"] = {str(r): Kind.STUCK_OUTSIDE_COLLECTIVE.value for r in outside}
    d.details["rendezvous_ranks"] = list(inside)
    ctx.add(
        "no process group was ever created: rank%s %s %s inside init_process_group (the rendezvous), waiting "
        "for the others; rank%s %s never reached it"
        % (
            "s" if len(inside) > 1 else "",
            format_ranks(inside, 8),
            "are" if len(inside) > 1 else "is",
            "s" if len(outside) > 1 else "",
            format_ranks(list(outside), 8),
        )
    )
    for r, why in list(outside.items())[:6]:
        ctx.add("rank %d: %s" % (r, why))
    holders = _holders(ctx, inside)
    if holders and any("lock" in why for why in outside.values()):
        r, held = holders[0]
        text = (
            "rank %d holds a file lock on %s while it waits in the rendezvous for the ranks that wait for a "
            "file lock (most likely that one): a cycle" % (r, ", ".join(held[:2]))
        )
        d.details["rendezvous_lock"] = text
        ctx.add(text)
    note = stall_note(ctx)
    if note:
        ctx.add(note)
