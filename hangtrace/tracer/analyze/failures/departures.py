"""Departures: a rank whose program returned while its peers still needed it (pure).

A rank that exits cleanly (code 0) is no death. But when it leaves first and its peers'
collectives then fail with transport errors ("Connection closed by peer": gloo fails every
collective with a member whose process is gone), nothing died: the rank *left*, and the
failures are its peers' connections to it closing, not the network (blind helper 92: a
graceful-preemption SIGTERM handler that ends the training loop on the one rank the node
agent signalled; its peers failed in DDP's gradient all-reduce 0.7 s later, and the
verdict named a peer, or "no rank is dead ... check the network").

:func:`departed` finds that rank: the earliest clean exit of a rank when

* its exit time is known (its exit record), and no failure of any rank (death or failed
  record) came before it;
* the first failure after it is a transport victim (``causes.is_transport_error``),
  within :data:`DEPART_WINDOW_NS`, raised in its rank's program, not after that program had
  returned (an exit handler's collective after the others left is the minority's own
  divergence: ``rules/minority.after_return``);
* no non-victim death but SIGTERMs (the launcher tearing the job down after the
  failures) came before that first failure.

The departure is a root for ``deaths.roots`` (``RankView.departed``); ``rules/dead_rank``
explains it as 'skipped-collective' (cause 'skipped'). Times are ns since the epoch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional, Sequence

from hangtrace.tracer.diagnosis import Cause

if TYPE_CHECKING:
    from hangtrace.tracer.analyze.context import Ctx
    from hangtrace.tracer.analyze.rankview import RankView

#: The first transport failure must come within this many ns of the departure (a peer
#: computing a long step meets the closed connection at its next collective).
DEPART_WINDOW_NS = 120_000_000_000


def clean_exit_wall(v: RankView) -> int:
    """When rank ``v``'s program ended with exit code 0 (its exit record), else 0."""
    p = v.proc
    if v.dead or p.exit_code != 0 or not p.exit_wall_ns:
        return 0
    ex = p.exiting
    return int((ex or {}).get("wall_ns") or p.exit_wall_ns)


def _in_program(v: Optional[RankView], wall: int) -> bool:
    """Did rank ``v`` fail at ``wall`` before its program returned (not in an exit handler)?"""
    if v is None:
        return False
    ex = v.proc.exiting
    return ex is None or wall < int(ex.get("wall_ns") or 0)


def departed(ctx: Ctx, fails: Sequence[Dict[str, Any]]) -> Optional[RankView]:
    """The rank that left first (module docstring), with ``departed`` and ``fail_wall`` (its
    exit) set, or None. ``fails``: ``deaths.failures(ctx)``, by time."""
    if not fails:
        return None
    leavers = sorted((t, r) for t, r in ((clean_exit_wall(v), r) for r, v in ctx.views.items()) if t)
    if not leavers:
        return None
    t_exit, rank = leavers[0]
    first = fails[0]
    t_fail = int(first.get("wall_ns") or 0)
    if not (first.get("victim") and t_exit <= t_fail <= t_exit + DEPART_WINDOW_NS):
        return None
    if not _in_program(ctx.views.get(first["rank"]), t_fail):
        return None
    v = ctx.views[rank]
    v.departed = True
    v.fail_wall = t_exit
    v.cause = Cause.SKIPPED.value
    v.cause_text = "exited cleanly (code 0) while its peers still needed it"
    return v


def departure_root(
    ctx: Ctx, deaths: Sequence[RankView], fails: Sequence[Dict[str, Any]]
) -> Optional[RankView]:
    """:func:`departed` when none of the non-victim ``deaths`` but a SIGTERM (a launcher
    tearing the job down) came before the first of ``fails`` (``deaths.failures``); else None."""
    if not fails or any(
        (v.fail_wall or 0) < int(fails[0]["wall_ns"] or 0) and v.cause != Cause.SIGTERM.value for v in deaths
    ):
        return None
    return departed(ctx, fails)


def sent_by(sig: Optional[Mapping[str, Any]]) -> str:
    """``" from pid 4242 (bash -c sleep 6; kill -TERM 17)"``: who sent the SIGTERM of a
    stack dump ``sig`` (``{'sender': {'pid', 'uid', 'cmdline'}}``, the line the C extension
    writes, ``collect.ringprocs.signal_sender``), or '' when it is not recorded."""
    snd = (sig or {}).get("sender") or {}
    if not snd.get("pid"):
        return ""
    cmd = str(snd.get("cmdline") or "")
    return " from pid %s%s" % (
        snd["pid"],
        " (%s)" % (cmd[:160] + ("..." if len(cmd) > 160 else "")) if cmd else "",
    )


def sigterm_before(v: RankView) -> Optional[Dict[str, Any]]:
    """The SIGTERM dump rank ``v`` wrote before its program returned (a handler that
    ended its loop: graceful preemption), or None: ``{'wall_ns', 'text', ...}``."""
    sig = (v.proc.signals or {}).get("sigterm")
    if not sig:
        return None
    t = int(sig.get("wall_ns") or 0)
    return sig if not t or not v.fail_wall or t <= v.fail_wall else None
