"""Rule *timeout_waiter* -> 'stuck-outside-collective': a rank gave up waiting in a
collective (a transport *timeout*: gloo's "Timed out waiting ...ms for recv", NCCL's
watchdog) before any other rank failed, and the ranks it waited for were, by their
stacks, outside any collective.

A collective the rings never see (DDP's gradient all-reduce runs in C++) leaves no record
to build a wait-for graph from; the timeout is the wait, and the timed-out rank's
exception is its only trace. Its peers' stacks - live (py-spy) or dumped when the launcher
tore the job down (faulthandler on SIGTERM) - say where they were: a peer outside every
collective is the one waited for (a DataLoader worker on a slow mount, a rank-only
checkpoint). Without this rule the first *non-victim* death was the peer's SIGTERM from
torchrun's teardown, reported as "sigterm-external: find who sent SIGTERM" (a job written
from a timeout incident, 2026-12-04).

Fires only when the timeout is the first failure by time (a peer that died first is the
root: rule dead_rank) and at least one other rank has a stack and is outside collectives.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

from hangtrace.tracer.analyze.stuck.blocking import blocking_reason, collective_frame
from hangtrace.tracer.analyze.context import Ctx
from hangtrace.tracer.analyze.rankview import RankView
from hangtrace.tracer.analyze.failures.causes import TRANSPORT_MARKERS
from hangtrace.tracer.analyze.failures.deaths import failures
from hangtrace.tracer.analyze.evidence import fill_common, frames_of, ts
from hangtrace.tracer.analyze.rules.base import Finding
from hangtrace.tracer.analyze.failures.exceptions import short_error
from hangtrace.tracer.analyze.stuck.stacktree import format_ranks
from hangtrace.tracer.diagnosis import Cause, Diagnosis, Kind

NAME = "timeout_waiter"

_RUNNING = "no known blocking call on its stack (busy, or in C code it called)"  # (a culprit's reason then)
#: the same when its only stack is the one dumped as it was stopped (no kernel state with it:
#: blind helper 89's rank blocked in a socket recv read "busy" after the teardown)
_RUNNING_DUMPED = (
    "no blocking call its stack can name (dumped as it was stopped, without its system call): "
    "in a C call it made there (a socket or file read, a lock, a native library), or busy"
)

#: lower-case texts of a collective that gave up waiting: the transport markers that are timeouts
TIMEOUT_MARKERS = tuple(m for m in TRANSPORT_MARKERS if "time" in m)


def _timeout(v: RankView) -> Optional[str]:
    text = (v.cause_text or "") if v.dead else str((v.failed or {}).get("error") or "")
    return text if any(m in text.lower() for m in TIMEOUT_MARKERS) else None


def find(ctx: Ctx) -> Optional[Finding]:
    """The ranks outside collectives that a first-failing timed-out rank waited for
    (``data``: (the timed-out view, its text, [(rank, reason)])), or None."""
    fails = failures(ctx)
    if not fails:
        return None
    first = ctx.views.get(fails[0]["rank"])
    text = _timeout(first) if first is not None else None
    if first is None or text is None:
        return None
    out: List[Tuple[int, str]] = []
    for r, v in sorted(ctx.views.items()):
        if r == first.rank:
            continue
        _labels, frames, thread = frames_of(ctx, r)
        if not frames or collective_frame(frames):
            continue
        out.append(
            (
                r,
                blocking_reason(frames, thread=thread)
                or (_RUNNING if ctx.views[r].proc.stacks else _RUNNING_DUMPED),
            )
        )
    if not out:
        return None
    return Finding(NAME, tuple(r for r, _ in out), first.fail_wall or 0, data=(first, text, out))


def explain(ctx: Ctx, finding: Finding, d: Diagnosis) -> None:
    """Kind, cause, culprits and their reasons (``details['culprit_reasons']``), the
    timeout (``details['timed_out']``: {rank, text, wall_ns, ranks: every rank whose
    collective timed out}), every failure as cascade."""
    first, text, outside = finding.data
    d.kind = Kind.STUCK_OUTSIDE_COLLECTIVE
    fill_common(ctx, d, [r for r, _ in outside], None)
    d.waiting_ranks = [first.rank]
    reasons = {str(r): why for r, why in outside}
    d.details["culprit_reasons"] = reasons
    d.details["culprit_kinds"] = {str(r): Kind.STUCK_OUTSIDE_COLLECTIVE.value for r, _ in outside}
    gave_up = sorted(
        {
            c["rank"]
            for c in failures(ctx)
            if c.get("rank") not in reasons
            and c.get("rank") is not None
            and "timed out" in str(c.get("text") or "").lower()
        }
        | {first.rank}
    )
    d.details["timed_out"] = {
        "rank": first.rank,
        "text": short_error(text, 300),
        "wall_ns": first.fail_wall,
        "ranks": gave_up,
    }
    d.cause = (
        Cause.BLOCKED
        if any(w not in (_RUNNING, _RUNNING_DUMPED) for w in reasons.values())
        else Cause.NO_PROGRESS
    )
    ctx.add(
        "rank %d gave up waiting in a collective at %s: %s" % (first.rank, ts(first.fail_wall), text[:300])
    )
    dumped = [
        r for r, _ in outside if not ctx.views[r].proc.stacks
    ]  # (their stacks from a faulthandler dump)
    for r, why in outside[:6]:
        ctx.add(
            "rank %d (%s): %s" % (r, "its last stack, dumped as it died" if r in dumped else "its stack", why)
        )
    if dumped:
        ctx.add(
            "the job was torn down after the timeout: a stall threshold (--stall-s) below the collective's "
            "timeout gets the stacks of every live process, DataLoader workers included, before that"
        )
    if len(outside) > 6:
        ctx.add("... and %s" % format_ranks([r for r, _ in outside[6:]], 8))
    d.cascade = failures(ctx)  # the timeout first, then the teardown
