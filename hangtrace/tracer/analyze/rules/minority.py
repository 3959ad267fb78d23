"""Rule *minority* -> 'skipped-collective', cause 'extra-collective' (the minority flip
of the chain; checked before *chain*).

When every missing member (with a process) of the chain's main instance was classified
as having moved on ('skipped-collective'), they are all chain ends, the waiters are
fewer than the missing ones (or entered it in an exit handler, after their program had
returned, failed and left) and nobody waits for the waiters, the waiting minority is
what diverged (rank 0 alone in a checkpoint barrier the others never call): it is named.
P2P instances never flip. For the arbiter the Finding carries the chain ends as
``culprits`` (as rule *chain* would), so hang-versus-death precedence is that of the chain.
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence

from hangtrace.tracer.analyze.stuck.chainends import ChainEnds
from hangtrace.tracer.analyze.stuck.exitwait import exiting_event
from hangtrace.tracer.analyze.context import Ctx
from hangtrace.tracer.analyze.rankview import RankView
from hangtrace.tracer.analyze.evidence import fill_common, rank_line, rk
from hangtrace.tracer.analyze.failures.exceptions import short_error
from hangtrace.tracer.analyze.rules.base import Finding
from hangtrace.tracer.analyze.rules.chain import chain_finding, main_instance
from hangtrace.tracer.analyze.graph.waitgraph import inst_text
from hangtrace.tracer.diagnosis import Cause, Diagnosis, Kind

NAME = "minority"


def find(ctx: Ctx) -> Optional[Finding]:
    """The chain Finding (``data``: (ChainEnds, main instance)) when the flip applies."""
    f = chain_finding(ctx, NAME)
    if f is None:
        return None
    ce: ChainEnds = f.data
    main = main_instance(ce)
    if main is None or main.p2p:
        return None
    miss_present = [m for m in main.missing if m in ctx.views]
    all_moved = bool(miss_present) and all(
        ce.kinds.get(m, ("", ""))[0] == Kind.SKIPPED_COLLECTIVE.value for m in miss_present
    )
    fewer = len(main.waiters) < len(main.missing) or _at_exit_alone(ctx, main.waiters)
    if all_moved and fewer and not (set(main.waiters) & ce.waited) and set(miss_present) <= set(ce.present):
        return Finding(NAME, f.culprits, f.start, end_kinds=f.end_kinds, data=(ce, main))
    return None


def _at_exit_alone(ctx: Ctx, waiters: Sequence[int]) -> bool:
    """Every waiter entered the collective after its main program had returned, failed and
    left (``failed_and_left``, ``after_return``): what diverged is the exit handler, however
    many ranks left without it (2 ranks: rank 1's ``atexit`` all_reduce after rank 0 had
    destroyed its group; the chain named rank 0, which "never reached" it)."""
    return bool(failed_and_left(ctx, waiters)) and all(after_return(ctx.views[w]) for w in waiters)


def explain(ctx: Ctx, finding: Finding, d: Diagnosis) -> None:
    """The waiters named; the lines of the members that moved on."""
    ce, main = finding.data
    kinds = ce.kinds
    d.kind = Kind.SKIPPED_COLLECTIVE
    d.cause = Cause.EXTRA_COLLECTIVE
    fill_common(ctx, d, main.waiters, main)
    ctx.add(
        "%s alone entered %s (%s); %s never called it and moved on: the minority "
        "took a different path (e.g. a rank-0-only checkpoint/barrier)"
        % (
            rk(main.waiters, 8),
            inst_text(ctx, main),
            ctx.blocked(main.waiters[0]).get("op"),
            rk(main.missing, 8),
        )
    )
    for m in main.missing[:3]:
        ctx.add(
            rank_line(ctx, m, main.group) + " (%s)" % kinds[m][1]
            if m in kinds
            else rank_line(ctx, m, main.group)
        )
    d.details["culprit_kinds"] = {str(r): Kind.SKIPPED_COLLECTIVE.value for r in main.waiters}
    gave_up = failed_and_left(ctx, main.waiters)
    if gave_up:
        d.details["minority_failed"] = gave_up
        at_exit = [r for r in main.waiters if after_return(ctx.views[r])]
        if at_exit:
            d.details["minority_at_exit"] = at_exit


def failed_and_left(ctx: Ctx, ranks: Sequence[int]) -> Dict[str, str]:
    """rank -> what became of it, for the waiters whose collective failed with a transport
    error (its peers had gone) and whose process is gone too: such a rank waits no more (a
    program that catches the error, e.g. a collective in an ``atexit`` handler after the
    others destroyed their group, exits 0). Empty unless every one of ``ranks`` did so."""
    out: Dict[str, str] = {}
    for r in ranks:
        v = ctx.views.get(r)
        if v is None or not v.blocked_failed or v.proc.state not in ("exited", "killed"):
            return {}
        err = short_error((v.blocked or {}).get("error") or "a transport error")
        left = (
            "exited cleanly (code %s)" % v.proc.exit_code
            if v.proc.state == "exited"
            else "its process is gone"
        )
        out[str(r)] = "%sit failed there (%s) and %s" % (
            "it entered it after its program had returned, in an exit handler (atexit, or a thread ending at "
            "shutdown); "
            if after_return(v)
            else "",
            err,
            left,
        )
    return out


def after_return(v: RankView) -> bool:
    """Did rank ``v`` enter its blocked collective after its main program had returned (its
    ``exiting`` event, hooks/process/lifecycle.py, is older): in an exit handler (blind helper 87: a
    metrics logger's ``atexit`` all_reduce on one rank)?"""
    ex = exiting_event(v.proc)
    return ex is not None and int((v.blocked or {}).get("t_wall_ns") or 0) >= int(
        ex.get("wall_ns") or 1 << 62
    )
