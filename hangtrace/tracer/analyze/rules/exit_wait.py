"""Rule *exit_wait* -> 'stuck-outside-collective': the job does not exit at the end.

Nothing progressed, no rank waits in a collective, nobody died, and a live rank's
program has returned while its process does not exit: the interpreter joins a
non-daemon thread that never ends, or an exit handler blocks (``analyze/stuck/exitwait.py``
says which, and what that thread waits for). Without this rule the verdict was
"Unknown: nothing progressed but no rank is in a collective" (a job of ours written
from the incident "the job does not exit after training", 2026-12-04).

A fallback rule (``rules.FALLBACK_RULES``, before *idle*): tried only when no hang and
no death were found; fires only when the run is stalled (``ctx.stalled``), so a rank
caught for a moment joining a thread that is finishing is not a verdict. A rank at exit
while others wait for it in a collective is a chain end (rule *chain*, which says the
same of it through ``analyze/stuck/chainends.py``).
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

from hangtrace.tracer.analyze.context import Ctx
from hangtrace.tracer.analyze.evidence import fill_common, stall_note
from hangtrace.tracer.analyze.stuck.exitwait import exit_wait
from hangtrace.tracer.analyze.rules.base import Finding
from hangtrace.tracer.analyze.stuck.stacktree import format_ranks
from hangtrace.tracer.diagnosis import Cause, Diagnosis, Kind

NAME = "exit_wait"


def find(ctx: Ctx) -> Optional[Finding]:
    """The live ranks at exit (``data``: {rank: what the exit waits for}) when the run is
    stalled and no rank waits in a collective, or None."""
    if not ctx.stalled or any(v.blocked is not None and not v.dead for v in ctx.views.values()):
        return None
    at_exit: Dict[int, Tuple[str, str]] = {}
    for r, v in sorted(ctx.views.items()):
        if v.dead:
            continue
        found = exit_wait(v.proc)
        if found:
            at_exit[r] = found
    return Finding(NAME, tuple(at_exit), data=at_exit) if at_exit else None


def explain(ctx: Ctx, finding: Finding, d: Diagnosis) -> None:
    """Kind, cause, culprits, ``details['exit_wait']`` ({rank: text}), ``details['exit_how']``
    (:func:`exitwait.main_at_exit`'s word for the first culprit) and
    ``details['exited_ranks']`` (ranks whose process exited cleanly)."""
    found: Dict[int, Tuple[str, str]] = finding.data
    at_exit = {r: text for r, (_how, text) in found.items()}
    d.kind = Kind.STUCK_OUTSIDE_COLLECTIVE
    d.cause = Cause.BLOCKED
    fill_common(ctx, d, list(at_exit), None)
    d.details["exit_wait"] = {str(r): t for r, t in at_exit.items()}
    d.details["exit_how"] = next(iter(found.values()))[
        0
    ]  # (the first culprit's: '_shutdown', 'executor', 'handler')
    d.details["culprit_reasons"] = {str(r): t for r, t in at_exit.items()}
    d.details["culprit_kinds"] = {str(r): Kind.STUCK_OUTSIDE_COLLECTIVE.value for r in at_exit}
    exited = sorted(r for r, v in ctx.views.items() if v.proc.state == "exited" and not v.dead)
    d.details["exited_ranks"] = exited
    for r, text in list(at_exit.items())[:6]:
        ctx.add("rank %d: %s" % (r, text))
    if exited:
        ctx.add("rank%s %s exited cleanly" % ("s" if len(exited) > 1 else "", format_ranks(exited, 8)))
    others = sorted(r for r, v in ctx.views.items() if r not in at_exit and r not in exited)
    if others:
        ctx.add(
            "rank%s %s neither exited nor at exit, and in no collective"
            % ("s" if len(others) > 1 else "", format_ranks(others, 8))
        )
    note = stall_note(ctx)
    if note:
        ctx.add(note)
