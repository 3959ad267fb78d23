"""Rule *unschedulable* -> ``unschedulable-actor``: a process waits on a Ray actor that
never got a process, and what the actor asks for exceeds every node of the cluster
(issue 9; verl #7656: an engine created with ``num_gpus=1`` on a cluster without a GPU,
the driver blocked in ``ray.get`` on its address forever).

Evidence, from the processes' own records first (they survive the cluster):

* the wait: an open ``K_WAIT`` record on the actor (``analyze/actors/actorgraph.py``: its
  ``absent`` targets, no process in the snapshot carries the actor id);
* the request: the ``ray_actor_create`` event the creating process wrote
  (``hooks/rayhooks/ray_calls.py``: class, name, resources to place it, placement group);
* what the cluster offers: ``meta['ray_cluster_nodes']`` (each alive node's total
  resources, read by the creating process) - else Ray's ``cluster_resources`` from
  ``Snapshot.ray_state`` (totals over all nodes: a request beyond them fits no node).

Ray's own record of the actor (``Snapshot.ray_state['actors']``: state such as
``PENDING_CREATION``, ``required_resources``), when ``dump --ray`` could reach the
cluster, is shown beside ours and stands in for a missing creation record.

Fires only when the job made no progress for the stall threshold, for the oldest such
wait: kind ``unschedulable-actor`` (cause None), ``culprit_actors`` = the actor,
``details['actor_request']`` (resources asked, placement group), ``details['cluster_nodes']``
(what each node has), ``details['actor_waiters']``. Not judged: whether a placement
group's bundles fit (an actor in a group is named only when its own request fits no node),
and an actor that fits a node but waits for resources other actors hold.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple

from hangtrace.tracer.analyze.actors import actorgraph as G
from hangtrace.tracer.analyze.context import Ctx
from hangtrace.tracer.analyze.evidence import ts
from hangtrace.tracer.analyze.rules.actor_waits import graph, stale
from hangtrace.tracer.analyze.rules.base import Finding
from hangtrace.tracer.diagnosis import Diagnosis, Kind

NAME = "unschedulable"

#: resources Ray adds to every node that say nothing about capacity
_NODE_MARKERS = ("node:",)


def creations(ctx: Ctx) -> Dict[str, Tuple[Dict[str, Any], str]]:
    """actor id -> (its ``ray_actor_create`` event, the creating process's key)."""
    out: Dict[str, Tuple[Dict[str, Any], str]] = {}
    for p in ctx.snap.processes:
        for e in p.events or ():
            if isinstance(e, dict) and e.get("event") == "ray_actor_create" and e.get("actor_id"):
                out[str(e["actor_id"])] = (e, p.key)
    return out


def cluster_nodes(ctx: Ctx) -> Tuple[List[Dict[str, Any]], str]:
    """Each node's total resources and where that came from: the newest
    ``ray_cluster_nodes`` a process recorded, else Ray's cluster totals as one entry."""
    best: Optional[Mapping[str, Any]] = None
    for p in ctx.snap.processes:
        m = p.meta or {}
        if isinstance(m.get("ray_cluster_nodes"), list) and (
            best is None or (m.get("ray_cluster_wall_ns") or 0) > (best.get("ray_cluster_wall_ns") or 0)
        ):
            best = m
    if best is not None:
        return list(best["ray_cluster_nodes"]), "recorded by the process that created it at %s" % (
            ts(int(best.get("ray_cluster_wall_ns") or 0)),
        )
    total = (ctx.snap.ray_state or {}).get("cluster_resources")
    if isinstance(total, dict) and total:
        return [{"node_id": "(all nodes)", "resources": total}], "Ray's cluster totals"
    return [], ""


def _ray_row(ctx: Ctx, actor_id: str) -> Optional[Dict[str, Any]]:
    for a in (ctx.snap.ray_state or {}).get("actors") or ():
        if isinstance(a, dict) and a.get("actor_id") == actor_id:
            return a
    return None


def _fits(request: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    return all(float(node.get(k) or 0) + 1e-9 >= float(v) for k, v in request.items() if float(v or 0) > 0)


def _short(res: Mapping[str, Any]) -> str:
    """``{CPU: 1, GPU: 1}``: the resources that matter (no node markers, memory in GiB)."""
    parts = []
    for k in sorted(res):
        if k.startswith(_NODE_MARKERS) or not float(res[k] or 0):
            continue
        v = float(res[k])
        if k in ("memory", "object_store_memory"):
            parts.append("%s: %.1f GiB" % (k, v / (1 << 30)))
        else:
            parts.append("%s: %s" % (k, ("%g" % v)))
    return "{%s}" % ", ".join(parts)


def find(ctx: Ctx) -> Optional[Finding]:
    """``data``: (actor id, target, waits on it, request, creation event, creator key,
    nodes, nodes source, Ray's row)."""
    if not stale(ctx):
        return None
    g = graph(ctx)
    if not g.absent:
        return None
    made = creations(ctx)
    nodes, source = cluster_nodes(ctx)
    for w, t in sorted(g.absent, key=lambda x: x[0].since_wall_ns):
        ev, creator = made.get(t.actor_id, ({}, ""))
        row = _ray_row(ctx, t.actor_id)
        request = ev.get("placement") or ev.get("resources") or (row or {}).get("required_resources")
        if not isinstance(request, dict) or not request or not nodes:
            continue
        if any(_fits(request, n.get("resources") or {}) for n in nodes):
            continue
        waits = [x for x, y in g.absent if y.actor_id == t.actor_id]
        return Finding(
            NAME, (), w.since_wall_ns, data=(t.actor_id, t, waits, request, ev, creator, nodes, source, row)
        )
    return None


def explain(ctx: Ctx, finding: Finding, d: Diagnosis) -> None:
    """Kind, ``culprit_actors``, ``details['actor_request' | 'cluster_nodes' |
    'actor_waiters']``, Ray's record as ``details['ray_says']``; evidence lines."""
    aid, t, waits, request, ev, creator, nodes, source, row = finding.data
    cls = ev.get("cls") or t.cls or (row or {}).get("class_name") or "actor"
    name = ev.get("name") or (row or {}).get("name") or ""
    lab = "%s '%s'" % (cls, name) if name else cls
    d.kind, d.cause = Kind.UNSCHEDULABLE_ACTOR, None
    d.culprit_actors = [lab]
    missing = _short_of(request, nodes)
    d.details["actor_request"] = {
        "actor": lab,
        "actor_id": aid,
        "resources": dict(request),
        "placement_group": ev.get("placement_group"),
        "bundle_index": ev.get("bundle_index"),
        "created_by": creator or None,
        "created_wall_ns": ev.get("wall_ns"),
        "short_of": missing,
    }
    d.details["cluster_nodes"] = [
        {"node_id": n.get("node_id"), "host": n.get("host"), "resources": n.get("resources")} for n in nodes
    ]
    ctx.add(
        "Ray actor %s (actor id %s) asks for %s%s; no process of it is in the snapshot"
        % (
            lab,
            aid[:12],
            _short(request),
            " (created by %s at %s)" % (creator, ts(int(ev["wall_ns"])))
            if creator and ev.get("wall_ns")
            else "",
        )
    )
    for n in nodes[:8]:
        ctx.add(_node_line(n, source))
    ctx.add("no node offers %s" % ", ".join("%s %g" % (k, float(request[k])) for k in missing))
    d.details["actor_waiters"] = _waiters(ctx, waits, t, cls)
    if row is not None:
        says = _ray_says(lab, row)
        d.details["ray_says"] = {lab: {"text": says, "actor_state": row.get("state")}}
        ctx.add("Ray actor %s: Ray says: %s" % (lab, says))
    if finding.start:
        d.details["hang_start_wall_ns"] = finding.start


def _short_of(request: Mapping[str, Any], nodes: List[Dict[str, Any]]) -> List[str]:
    """The resources of ``request`` that no node of ``nodes`` has enough of, sorted."""
    return sorted(
        {
            k
            for k, v in request.items()
            if float(v or 0) > 0
            and not any(float((n.get("resources") or {}).get(k) or 0) + 1e-9 >= float(v) for n in nodes)
        }
    )


def _node_line(n: Mapping[str, Any], source: str) -> str:
    """The evidence line of one node ``n`` (its id, host, resources; ``source`` said where from)."""
    return "node %s%s has %s (%s)" % (
        str(n.get("node_id") or "?")[:12],
        " (%s)" % n["host"] if n.get("host") else "",
        _short(n.get("resources") or {}),
        source,
    )


def _waiters(ctx: Ctx, waits: List[G.Wait], t: G.Target, cls: str) -> List[Dict[str, Any]]:
    """``details['actor_waiters']`` for the waits ``waits`` on target ``t`` (class ``cls``),
    adding one evidence line per wait."""
    waiters: List[Dict[str, Any]] = []
    g = graph(ctx)
    for w in waits:
        p = g.procs.get(w.key)
        who = G.label(p, g.roles) if p is not None else w.key
        waiters.append(
            {
                "actor": who,
                "process": w.key,
                "method": w.method,
                "api": w.api,
                "target_method": t.method,
                "since_wall_ns": w.since_wall_ns,
            }
        )
        ctx.add(
            "%s (%s)%s waits (%s since %s) on %s.%s"
            % (
                who,
                w.key,
                " in %s" % w.method if w.method else "",
                G.call_text(w.api),
                ts(w.since_wall_ns),
                cls,
                t.method,
            )
        )
    return waiters


def _ray_says(lab: str, row: Mapping[str, Any]) -> str:
    """What Ray's record ``row`` of actor ``lab`` says: its state and required resources."""
    return "actor %s is %s%s" % (
        lab,
        row.get("state") or "?",
        ", required resources %s" % _short(row["required_resources"])
        if isinstance(row.get("required_resources"), dict)
        else "",
    )
