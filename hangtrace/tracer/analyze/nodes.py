"""The nodes of a multi-node job in the verdict (issue 39). Pure.

In: a snapshot whose processes carry ``meta['node_rank']`` (a job-wide snapshot joined from
node summaries, or ``hangtrace analyze DIR1 DIR2``; ``collect/nodes/``) and its
``Snapshot.nodes`` (which nodes were seen, and why not). Out: ``details['nodes']`` =
``{'culprits': {rank: 'node N (host)'}, 'unseen': [line, ...], 'count': int}``, one evidence
line per culprit's node and per node not seen (the report's paragraph names them:
``report/paragraph.py``). Nothing for a single-node snapshot.
"""

from __future__ import annotations

from typing import Any, Dict, List

from hangtrace.tracer.analyze.context import Ctx
from hangtrace.tracer.diagnosis import Diagnosis


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
        unseen.append(
            "node %s (%s; %s): %s"
            % (
                n.get("node_rank"),
                n.get("host") or "host unknown",
                _span(n.get("ranks") or []),
                n.get("why") or "not seen",
            )
        )
    out: Dict[str, Any] = {"culprits": {str(r): w for r, w in culprits.items()}, "unseen": unseen}
    out["count"] = max(len(nodes), len(set(where.values())))
    d.details["nodes"] = out
    for r, w in sorted(culprits.items()):
        ctx.evidence.append("rank %d is on %s" % (r, w))
    for line in unseen:
        ctx.evidence.append("not seen: %s" % line)
