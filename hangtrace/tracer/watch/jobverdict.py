"""The job-wide verdict of one incident from this node's snapshot and the other nodes'
summaries (issue 39). Composes ``collect/nodes`` with ``tracer.pipeline``.

In: this node's ``pipeline.Result`` (its snapshot folder), the meeting, the parts gathered.
Out: the job-wide ``pipeline.Result``: the parts stored in the snapshot folder
(``collect/nodes/jobsnap.write_parts``), the folder read back as ``hangtrace analyze`` reads
it (``pipeline.load_stored``) and diagnosed with ``diagnosis.json``/``report.txt`` rewritten:
the verdict names the culprits' nodes and every node it could not see, and why.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Optional

import orjson

Log = Callable[[str], None]


def node_doc(me: Any, run_dir: str) -> Dict[str, Any]:
    """The ``node`` object of this node's summaries."""
    return {
        "node_rank": me.node_rank,
        "node_count": me.node_count,
        "host": me.host,
        "run_dir": run_dir,
        "job": me.job,
    }


def publish_and_gather(meeting: Any, n: int, res: Any, wait_s: float, fetch_all: bool = True) -> Any:
    """Publish this node's summary of ``res.snapshot`` for incident ``n``; with
    ``fetch_all`` gather the other nodes' (``Meeting.gather``, at most ``wait_s`` s), else
    None. Raises StoreGone."""
    from hangtrace.tracer.collect.nodes.summaryformat import encode, node_envs

    snap = res.snapshot
    data = encode(snap, node_doc(meeting.me, meeting.run_dir), n, node_envs(meeting.run_dir, snap.processes))
    meeting.publish_part(n, data)
    return meeting.gather(n, wait_s) if fetch_all else None


def unseen_nodes(me: Any, snap: Any, why: str) -> List[Dict[str, Any]]:
    """``Snapshot.nodes`` when no other node could be reached (``why``): this node seen,
    every other one not, with the ranks not on this node when there are two nodes."""
    if me is None:
        return []
    ours = sorted(
        {p.rank for p in snap.processes if p.rank >= 0 and p.role is not None and p.role.value == "rank"}
    )
    world = max([p.world_size for p in snap.processes] or [0])
    others = [r for r in range(world) if r not in ours]
    out = [{"node_rank": me.node_rank, "host": me.host, "ranks": ours, "seen": True, "why": ""}]
    for r in range(me.node_count):
        if r != me.node_rank:
            out.append(
                {
                    "node_rank": r,
                    "host": None,
                    "ranks": others if me.node_count == 2 else [],
                    "seen": False,
                    "why": why,
                }
            )
    return out


def with_peers(nodes: List[Dict[str, Any]], peers: Dict[int, Dict[str, Any]]) -> List[Dict[str, Any]]:
    """``nodes`` (``Snapshot.nodes``) with what this node's watcher read of each node not seen
    (``peers``: node rank -> its last registration): its host and ranks when unknown, and
    ``last_beat_wall_ns`` (ns since the epoch), its watcher's last sign of life seen here."""
    out = []
    for n in nodes:
        reg = peers.get(int(n.get("node_rank", -1)))
        if n.get("seen") or not reg:
            out.append(n)
            continue
        n = dict(n)
        n["host"] = n.get("host") or reg.get("host")
        n["ranks"] = n.get("ranks") or sorted(int(r) for r in reg.get("ranks") or ())
        beat = max(int(n.get("last_beat_wall_ns") or 0), int(reg.get("beat_wall_ns") or 0))
        n["last_beat_wall_ns"] = beat or None
        out.append(n)
    return out


def assemble(run_dir: str, res: Any, me: Any, gathered: Any, nodes: List[Dict[str, Any]], log: Log) -> Any:
    """The job-wide Result (module docstring); ``res`` unchanged when it has no snapshot
    folder. Never raises: a failure is logged and ``res`` returned."""
    from hangtrace.tracer.collect.nodes.jobsnap import write_parts
    from hangtrace.tracer.pipeline import diagnose_snapshot, load_stored

    sdir = res.snapshot.path
    if not sdir or me is None:
        return res
    try:
        raw = gathered.raw if gathered is not None else {}
        parts = list(gathered.parts.values()) if gathered is not None else []
        errors = gathered.errors if gathered is not None else []
        write_parts(sdir, run_dir, me.node_rank, raw, parts, nodes, errors)
        snap = load_stored(sdir)
        import dataclasses

        snap = dataclasses.replace(snap, window=res.snapshot.window)
        return diagnose_snapshot(snap, store=True)
    except Exception as e:
        log("job-wide verdict failed (%r); node-local verdict kept" % (e,))
        return res


def verdict_doc(job: Any, me: Any, n: Optional[int] = None) -> Dict[str, Any]:
    """What node 0 publishes as the job's verdict of incident ``n``
    (``collect/nodes/jobverdictfile`` reads it back; ``diagnosis``: JSON schema 1)."""
    from hangtrace.tracer.report.json import diagnosis_json

    d = job.diagnosis
    return {
        "paragraph": job.paragraph,
        "kind": str(getattr(d.kind, "value", d.kind)),
        "culprit_ranks": list(d.culprit_ranks),
        "assembled_by": me.node_rank,
        "host": me.host,
        "nodes": job.snapshot.nodes,
        "snapshot": job.snapshot.path,
        "incident": n,
        "diagnosis": diagnosis_json(d),
    }


def node0_result(job: Any) -> Any:
    """``job`` (this node's Result of an incident, its snapshot folder holding node 0's verdict
    now), or node 0's verdict as a Result when node 0 saw more nodes (what ``hangtrace
    analyze`` of the folder gives). Never raises."""
    from hangtrace.tracer.collect.nodes.jobverdictfile import stored_job_verdict
    from hangtrace.tracer.pipeline import Result

    try:
        snap, jv = stored_job_verdict(job.snapshot)
    except Exception:
        return job
    return Result(snap, jv.diagnosis, jv.paragraph) if jv is not None else job


def store_verdict(sdir: Optional[str], doc: Dict[str, Any]) -> None:
    """Node 0's verdict stored in this node's snapshot folder (``nodes/job_verdict.json``)."""
    if not sdir:
        return
    os.makedirs(os.path.join(sdir, "nodes"), exist_ok=True)
    with open(os.path.join(sdir, "nodes", "job_verdict.json"), "wb") as f:
        f.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2, default=str))
