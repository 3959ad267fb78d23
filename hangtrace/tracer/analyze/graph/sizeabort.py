"""A rank aborted by gloo's size check: a collective mismatch, not a crash of its own (pure;
issue 37).

gloo checks that the data a collective receives fits what the rank posted; when more
arrives it throws from its transport thread and the process aborts (std::terminate,
SIGABRT). Measured on torch 2.13 gloo (``tests/integration/test_tiebreak_live.py``): the
aborted rank's stderr reads "terminate called after throwing an instance of
'gloo::EnforceNotMet' what(): [enforce fail at .../gloo/transport/tcp/pair.cc:456]
op.preamble.length <= op.nbytes. 36 vs 4. Received data size doesn't match expected size. Is
there a distributed collective mismatch in your code?", and its peers then fail with
"Connection reset by peer" (or "closed by peer"). That sentence is in no record: our
faulthandler file holds "Fatal Python error: Aborted" and the Python stacks, no exception
event is written (the throw is in a C++ thread). So the abort is known by its shape: a rank
killed by SIGABRT while its collective was in flight, and a peer of that group failing with
a transport error after it.

gloo aborts the rank that receives more than it posted: the rank with the *smaller* tensor,
which is not always the rank that changed. Who changed:

* the peers' records at that call carry other signatures: ``sigclasses.changed`` (majority,
  novelty, each rank's history) - the caller's case;
* the peers never made that call (their own count of the group's Python calls is lower: they
  were in a collective torch issued itself, DDP's bucket all-reduce in ``backward``): by the
  aborted rank's history (``graph/history.py``) its call is new - or no member ever issued
  its signature on the group - so it issued an extra collective and is named; its call is
  routine in its loop, so the peers skipped it and are named; else both, with the reason.

In: the context and the root death's view. Out: ``Unmatched`` (or None) and the lines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

from hangtrace.tracer.analyze.context import Ctx, history
from hangtrace.tracer.analyze.evidence import desc_rec, rk, traceback_frames
from hangtrace.tracer.analyze.failures.causes import is_transport_error
from hangtrace.tracer.analyze.graph import history as habits
from hangtrace.tracer.analyze.graph.skippedcall import own_call
from hangtrace.tracer.analyze.graph.waitgraph import signature
from hangtrace.tracer.analyze.rankview import RankView, Record
from hangtrace.tracer.analyze.stuck.stacktree import frame_label
from hangtrace.tracer.stackmodel.usercode import user_frame

#: gloo's own words when its size check fails (torch 2.13, gloo/transport/tcp/pair.cc); the
#: NCCL path has no such check: a mismatch there hangs or corrupts instead
GLOO_SIZE_CHECK = (
    "Received data size doesn't match expected size. Is there a distributed collective mismatch in your code?"
)
#: a peer's transport error at most this long after the abort is its consequence (ns)
AFTER_NS = 30_000_000_000


@dataclass(frozen=True)
class Unmatched:
    """The aborted ``rank``'s collective ``rec`` (its Python call ``call`` on ``group``) that
    the ``peers`` never made; ``culprits`` and the deciding ``line``; ``peer_lines``: where
    each peer was when it failed."""

    rank: int
    group: Any
    rec: Record
    call: int
    peers: Tuple[int, ...]
    culprits: Tuple[int, ...]
    line: str
    peer_lines: Tuple[str, ...]


def aborted(root: RankView) -> bool:
    """The root died of SIGABRT (a fatal-signal dump reading 'Aborted', or exit code -6)."""
    text = str(root.cause_text or "")
    return root.cause == "fatal-signal" and ("Aborted" in text or "-6" in text)


def failed_peers(ctx: Ctx, root: RankView, group: Any) -> List[int]:
    """Members of ``group`` besides the root that failed with a transport error after it."""
    out = []
    for r in ctx.members(group) or sorted(ctx.views):
        v = ctx.views.get(r)
        if v is None or r == root.rank:
            continue
        text = v.cause_text if v.dead else (v.failed or {}).get("error")
        when = v.fail_wall or 0
        if is_transport_error(text) and (
            not when or 0 <= when - root.fail_wall <= AFTER_NS or not root.fail_wall
        ):
            out.append(r)
    return out


def _last_call(ctx: Ctx, r: int, group: Any) -> int:
    v = ctx.views.get(r)
    calls = [
        own_call(x) or 0
        for x in (history(v.proc) if v is not None else ())
        if x.get("kind") == "collective" and x.get("group") == group
    ]
    return max(calls, default=0)


def _where_failed(ctx: Ctx, r: int) -> str:
    """'it failed in backward (job.py:54), from its exception's traceback' or ''."""
    v = ctx.views[r]
    frames = traceback_frames((v.proc.exception or {}).get("traceback"))
    f = user_frame(frames) if frames else None
    err = str(v.cause_text or (v.failed or {}).get("error") or "")[:100]
    at = ""
    if f is not None:  # the library call its own line made (backward: DDP's C++ all-reduce), then the line
        i = next((k for k, x in enumerate(frames) if x is f), 0)
        at = " in %s(its exception's traceback)" % "".join(
            frame_label(x) + " < " for x in frames[max(i - 1, 0) : i]
        )
        at = at.replace("(its", frame_label(f) + " (its")
    return "rank %d failed%s: %s" % (r, at, err)


def unmatched(ctx: Ctx, root: RankView) -> Optional[Unmatched]:
    """The case of the module doc where the peers never made the aborted rank's call, or None."""
    rec = root.blocked or (max(root.last.values(), key=lambda x: x.get("idx") or 0) if root.last else None)
    if not aborted(root) or rec is None or rec.get("kind") != "collective" or rec.get("state") != "issued":
        return None
    g, call = rec.get("group"), own_call(rec)
    peers = failed_peers(ctx, root, g)
    if call is None or not peers or any(_last_call(ctx, p, g) >= call for p in peers):
        return None
    culprits, line = _who(ctx, root, rec, peers)
    return Unmatched(
        root.rank,
        g,
        rec,
        call,
        tuple(peers),
        tuple(culprits),
        line,
        tuple(_where_failed(ctx, p) for p in peers),
    )


def _who(ctx: Ctx, root: RankView, rec: Record, peers: List[int]) -> Tuple[List[int], str]:
    g, sig = rec.get("group"), signature(rec)
    ever = [
        r
        for r in [root.rank] + peers
        for x in history(ctx.views[r].proc)
        if x is not rec
        and x.get("kind") == "collective"
        and x.get("group") == g
        and x.get("state") != "issued"
        and signature(x) == sig
    ]
    h = habits.habit(ctx, root.rank, g, rec)
    mine = "rank %d's %s (its Python call %s on %s)" % (root.rank, desc_rec(rec), own_call(rec), ctx.gdesc(g))
    never = "%s never made that call" % rk(peers, 8)
    if not ever or h.status in (habits.NEW, habits.OUT_OF_PLACE):
        why = "no member issued one on the group before" if not ever else h.text
        return [root.rank], "%s is an extra collective: %s; %s" % (mine, why, never)
    if h.status == habits.ROUTINE:
        return sorted(peers), "%s is routine in its loop (%s); %s: %s skipped it" % (
            mine,
            h.text,
            never,
            rk(peers, 8),
        )
    return sorted(
        [root.rank] + peers
    ), "history cannot decide which rank changed: %s; %s (%s); naming all" % (
        mine,
        never,
        h.text,
    )


def consequence_line(ctx: Ctx, root: RankView, group: Any, peers: List[int]) -> str:
    """The evidence line of the abort itself: gloo's size check, the signal and the peers'
    connection errors as its consequence."""
    backend = str((ctx.groups.get(group) or {}).get("backend") or "")
    who = "gloo" if backend in ("", "gloo") else "the backend (%s)" % backend
    return (
        "rank %d was aborted in it (%s): %s's size check aborts the rank that receives more data than it "
        "posted (%r, on that rank's stderr), not necessarily the rank that changed; %s"
        % (
            root.rank,
            (root.cause_text or "SIGABRT")[:80],
            who,
            GLOO_SIZE_CHECK,
            "%s then failed with a connection error: the consequence, not a cause" % rk(peers, 8)
            if peers
            else "the signal is the consequence of the mismatch, not a crash of its own",
        )
    )
