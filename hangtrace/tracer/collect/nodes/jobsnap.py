"""Other nodes' parts stored in a snapshot folder and read back; node-local run directories
combined (issue 39).

A job-wide snapshot is this node's own snapshot folder (``collect/rings.take_snapshot``:
its rings, stacks, ``processes.json``) plus ``nodes/``: ``node-<r>.summary`` (the raw node
summary each other node published, ``summaryformat``) and ``nodes.json`` (``{'self':
node rank, 'nodes': Snapshot.nodes, 'errors': [...]}``); the other nodes' environment
records go to the folder's ``env/`` beside copies of this node's own. ``hangtrace analyze``
of the folder (or of its run directory, whose newest snapshot it is) gives the job-wide
verdict again. :func:`combine` joins snapshots of several node-local run directories
copied from their nodes (``hangtrace analyze DIR1 DIR2 ...``).
"""

from __future__ import annotations

import dataclasses
import glob
import os
import shutil
from typing import Any, Dict, List, Mapping, Optional, Sequence

import orjson

from hangtrace.tracer.collect.nodes.summaryformat import NodePart, SummaryError, decode
from hangtrace.tracer.snapshot import ProcessInfo, Snapshot

NODES_DIR = "nodes"


def has_parts(sdir: str) -> bool:
    """True when the snapshot folder ``sdir`` holds other nodes' parts (``nodes.json``)."""
    return os.path.isfile(os.path.join(sdir, NODES_DIR, "nodes.json"))


def write_parts(
    sdir: str,
    run_dir: str,
    self_rank: int,
    raw: Mapping[int, bytes],
    parts: Sequence[NodePart],
    nodes: List[Dict[str, Any]],
    errors: Sequence[str] = (),
) -> None:
    """Store the other nodes' summaries (``raw``: node rank -> bytes, ``parts``: decoded) in
    ``sdir`` (module docstring). Raises OSError."""
    nd = os.path.join(sdir, NODES_DIR)
    os.makedirs(nd, mode=0o700, exist_ok=True)
    for r, data in raw.items():
        with open(os.path.join(nd, "node-%d.summary" % r), "wb") as f:
            f.write(data)
    env_dir = os.path.join(sdir, "env")
    os.makedirs(env_dir, mode=0o700, exist_ok=True)
    for src in glob.glob(os.path.join(run_dir, "env", "*.json")):
        shutil.copy2(src, env_dir)
    for part in parts:
        for e in part.envs:
            try:
                name = "%s-%d.json" % (e["host"], int(e["pid"]))
            except (KeyError, TypeError, ValueError):
                continue
            with open(os.path.join(env_dir, os.path.basename(name)), "wb") as f:
                f.write(orjson.dumps(e))
    with open(os.path.join(nd, "nodes.json"), "wb") as f:
        f.write(
            orjson.dumps(
                {"self": self_rank, "nodes": nodes, "errors": list(errors)}, option=orjson.OPT_INDENT_2
            )
        )


def _tag(p: ProcessInfo, node_rank: Optional[int]) -> ProcessInfo:
    meta = dict(p.meta or {})
    if meta.get("node_rank") is None:
        nr = meta.get("launch_node_rank", node_rank)
        try:
            meta["node_rank"] = int(nr) if nr is not None else None
        except (TypeError, ValueError):
            meta["node_rank"] = node_rank
    return dataclasses.replace(p, meta=meta) if meta != p.meta else p


def with_parts(snap: Snapshot, sdir: str) -> Snapshot:
    """``snap`` (this node's stored snapshot ``sdir``) joined with the parts stored in
    ``sdir/nodes``: their processes added, ``Snapshot.nodes`` set, unreadable parts as
    error lines naming the file and why."""
    errors = list(snap.errors)
    try:
        with open(os.path.join(sdir, NODES_DIR, "nodes.json"), "rb") as f:
            idx = orjson.loads(f.read())
        self_rank = int(idx.get("self", -1))
        nodes = [n for n in idx.get("nodes") or () if isinstance(n, dict)]
        errors += [str(e) for e in idx.get("errors") or ()]
    except (OSError, ValueError, TypeError, AttributeError) as e:
        return dataclasses.replace(snap, errors=errors + ["%s: unreadable (%s)" % (sdir, e)])
    procs = [_tag(p, self_rank) for p in snap.processes]
    seen = {p.key for p in procs}
    for path in sorted(glob.glob(os.path.join(sdir, NODES_DIR, "node-*.summary"))):
        try:
            with open(path, "rb") as f:
                part = decode(f.read())
        except (OSError, SummaryError) as e:
            errors.append("%s: %s (remedy: that node's processes are not analysed)" % (path, e))
            continue
        for p in part.processes:
            if p.key not in seen:
                seen.add(p.key)
                procs.append(p)
    return dataclasses.replace(snap, processes=procs, errors=errors, nodes=nodes)


def combine(snaps: Sequence[Snapshot]) -> Snapshot:
    """One snapshot of several nodes' snapshots (``hangtrace analyze DIR1 DIR2 ...``): their
    processes (the first of one ``host:pid`` kept), errors, and ``Snapshot.nodes`` from the
    ranks' recorded node ranks (``launch_node_rank``; else the directory's position)."""
    procs: List[ProcessInfo] = []
    errors: List[str] = []
    seen = set()
    nodes: Dict[int, Dict[str, Any]] = {}
    for i, s in enumerate(snaps):
        errors.extend(s.errors)
        for p in s.processes:
            p = _tag(p, i)
            if p.key in seen:
                continue
            seen.add(p.key)
            procs.append(p)
            nr = p.meta.get("node_rank")
            if isinstance(nr, int):
                n = nodes.setdefault(
                    nr, {"node_rank": nr, "host": p.host, "ranks": [], "seen": True, "why": ""}
                )
                if p.rank >= 0 and p.meta.get("launch_node_rank") is not None:
                    n["ranks"] = sorted(set(n["ranks"]) | {p.rank})
        for n in s.nodes:
            if not n.get("seen") and n.get("node_rank") not in nodes:
                nodes[int(n.get("node_rank", -1))] = dict(n)
    counts = [int(p.meta.get("launch_node_count", 0) or 0) for p in procs if p.meta.get("launch_node_count")]
    for r in range(max(counts or [0])):
        nodes.setdefault(
            r,
            {
                "node_rank": r,
                "host": None,
                "ranks": [],
                "seen": False,
                "why": "no run directory of it was given",
            },
        )
    first = snaps[0]
    return dataclasses.replace(
        first,
        processes=procs,
        errors=errors,
        taken_wall_ns=max(s.taken_wall_ns for s in snaps),
        nodes=[nodes[k] for k in sorted(nodes)],
        path=first.path if len(snaps) == 1 else None,
    )


def as_job(snap: Snapshot) -> Snapshot:
    """``snap``, or when it is one node's of several (:func:`one_of_several`) ``combine([snap])``:
    the verdict then names the nodes it lacks."""
    return combine([snap]) if one_of_several(snap) else snap


def one_of_several(snap: Snapshot) -> bool:
    """True when ``snap`` is one node's of a multi-node job (its ranks recorded a node count
    above 1) and says nothing of the other nodes yet (``Snapshot.nodes`` empty)."""
    if snap.nodes:
        return False
    for p in snap.processes:
        try:
            if int((p.meta or {}).get("launch_node_count") or 0) > 1:
                return True
        except (TypeError, ValueError):
            continue
    return False
