"""The nodes of a multi-node job in the verdict (issue 39). Pure.

In: a snapshot whose processes carry ``meta['node_rank']`` (a job-wide snapshot joined from
node summaries, or ``hangtrace analyze DIR1 DIR2``; ``collect/nodes/``) and its
``Snapshot.nodes`` (which nodes were seen, and why not). Out: ``details['nodes']`` =
``{'culprits': {rank: 'node N (host)'}, 'unseen': [line, ...], 'count': int}``, one evidence
line per culprit's node and per node not seen (the report's paragraph names them:
``report/paragraph.py``). Nothing for a single-node snapshot.

A node lost (:func:`lost_nodes`: not seen, none of its ranks with a record here, and the ranks
seen failed with transport errors: their peers' sockets closed) is the root; "went away
whole" when its watcher had been seen alive before (a ``last_beat_wall_ns`` in its
``Snapshot.nodes`` entry: its last sign of life), else "perhaps whole":
the verdict becomes a dead-rank one naming its ranks (``details['nodes']['lost']``, cause
``killed-without-record`` as seen from here), the ranks seen that failed after it its
cascade; never "no rank is dead" nor the OOM killer of one rank without saying the whole
node went.
"""

from __future__ import annotations

from typing import Any, Dict, List

import time

from hangtrace.tracer.analyze.context import Ctx
from hangtrace.tracer.analyze.failures.causes import is_transport_error
from hangtrace.tracer.diagnosis import Cause, Diagnosis, Kind


def _span(ranks: List[int]) -> str:
    rs = sorted(set(int(r) for r in ranks))
    if not rs:
        return "no rank known"
    if rs == list(range(rs[0], rs[-1] + 1)) and len(rs) > 1:
        return "ranks %d-%d" % (rs[0], rs[-1])
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(str(r) for r in rs)


def node_details(ctx: Ctx, d: Diagnosis) -> None:
    """Fill ``d.details['nodes']`` and evidence (module docstring); nothing when no process
    of the snapshot names its node and no node is listed."""
    nodes = list(ctx.snap.nodes or ())
    where: Dict[int, str] = {}
    for r, p in ctx.procs.items():
        nr = (p.meta or {}).get("node_rank")
        if nr is not None:
            where[r] = "node %s (%s)" % (nr, p.host)
    if not nodes and len({v for v in where.values()}) < 2:
        return
    culprits = {r: where[r] for r in d.culprit_ranks if r in where}
    unseen: List[str] = []
    for n in nodes:
        if n.get("seen"):
            continue
        why = n.get("why") or "not seen"
        if n.get("last_beat_wall_ns") and "last sign of life" not in why:
            why += "; its watcher's last sign of life at %s" % _hms(int(n["last_beat_wall_ns"]))
        unseen.append(
            "node %s (%s; %s): %s"
            % (n.get("node_rank"), n.get("host") or "host unknown", _span(n.get("ranks") or []), why)
        )
    lost = lost_nodes(ctx, d)
    if lost:
        culprits = _lose(ctx, d, lost)
    out: Dict[str, Any] = {"culprits": {str(r): w for r, w in culprits.items()}, "unseen": unseen}
    if lost:
        out["lost"] = lost
    out["count"] = max(len(nodes), len(set(where.values())))
    d.details["nodes"] = out
    for r, w in sorted(culprits.items()):
        ctx.evidence.append("rank %d is on %s" % (r, w))
    for line in unseen:
        ctx.evidence.append("not seen: %s" % line)


def _hms(wall_ns: int) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(wall_ns / 1e9))


def lost_nodes(ctx: Ctx, d: Diagnosis) -> List[Dict[str, Any]]:
    """The nodes lost whole (module docstring), each ``{node_rank, host, ranks,
    last_beat_wall_ns, why, text}`` (``text``: one sentence naming it and its last sign of
    life); [] when the verdict is no transport failure of the ranks seen."""
    failed_by_transport = d.kind == Kind.TRANSPORT_ERROR or (
        d.kind == Kind.DEAD_RANK and is_transport_error(d.details.get("cause_text"))
    )
    if not failed_by_transport:
        return []
    nofile = set(ctx.nofile)
    out: List[Dict[str, Any]] = []
    for n in ctx.snap.nodes or ():
        ranks = sorted(int(r) for r in n.get("ranks") or ())
        beat = int(n.get("last_beat_wall_ns") or 0)
        if n.get("seen") or not ranks or not set(ranks) <= nofile:
            continue
        who = "node %s (%s; %s)" % (n.get("node_rank"), n.get("host") or "host unknown", _span(ranks))
        if beat:
            text = (
                "%s went away whole: its ranks left no record here and its watcher no summary; its "
                "watcher's last sign of life at %s%s"
                % (
                    who,
                    _hms(beat),
                    ", %.0f s before this snapshot" % ((ctx.snap.taken_wall_ns - beat) / 1e9)
                    if ctx.snap.taken_wall_ns > beat
                    else "",
                )
            )
        else:  # its watcher never seen alive here: the ranks' closed sockets are the evidence
            text = (
                "%s is gone from this node's view, perhaps whole: its ranks closed their connections "
                "and left no record here, and its watcher was never seen here (%s)"
                % (who, n.get("why") or "not seen")
            )
        out.append(
            {
                "node_rank": n.get("node_rank"),
                "host": n.get("host"),
                "ranks": ranks,
                "last_beat_wall_ns": beat or None,
                "seen_alive": bool(beat),
                "why": n.get("why") or "",
                "text": text,
            }
        )
    return out


def _lose(ctx: Ctx, d: Diagnosis, lost: List[Dict[str, Any]]) -> Dict[int, str]:
    """``d`` made the verdict of the nodes ``lost``: their ranks the culprits (dead, killed
    without a record as seen from here), the ranks seen that failed after them its cascade.
    Returns the culprits' nodes (rank -> 'node N (host)')."""
    before = list(d.culprit_ranks)
    first = d.details.get("cause_text")
    ranks = sorted(r for n in lost for r in n["ranks"])
    d.kind, d.cause, d.culprit_ranks = Kind.DEAD_RANK, Cause.KILLED_WITHOUT_RECORD, ranks
    d.waiting_ranks = []
    if before and not any(c.get("rank") in before for c in d.cascade):
        d.cascade = [
            {"rank": r, "cause": "exception", "text": first or "", "victim": True} for r in before
        ] + list(d.cascade)
    d.details["cause_text"] = "; ".join(n["text"] for n in lost)
    for n in lost:
        ctx.evidence.insert(0, n["text"])
    return {
        r: "node %s (%s)" % (n["node_rank"], n["host"] or "host unknown") for n in lost for r in n["ranks"]
    }
