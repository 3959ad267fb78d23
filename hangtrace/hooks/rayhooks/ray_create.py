"""Ray actor creation requests (issue 9, rule ``unschedulable``), recorded in the process
that creates: ``ActorClass._remote`` (hooked by ``ray_install.install_calls``) writes one
durable ``ray_actor_create`` event per actor created (class, name, actor id, the resources
Ray reserves - :func:`actor_request`, the same defaults as Ray 2.60's
``ActorClass._remote`` - and the placement group), at most :data:`MAX_CREATES` per
process; and, at the first one, what the cluster offers: ``ray.nodes()`` (each alive
node's total resources) into the meta key ``ray_cluster_nodes`` (again, at most every
:data:`NODES_REFRESH_S` s, when a request fits none of the nodes known). In: the creation's
options and Ray handle; out: the event and meta in the recorder of ``ray_calls._recorder``.
Never raises into the program (errors logged once through ``ray_calls._say``).
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Tuple

from hangtrace.hooks.rayhooks import ray_calls as RC

#: ray_actor_create events written per process
MAX_CREATES = 1000
#: seconds between two reads of ray.nodes() in one process
NODES_REFRESH_S = 30.0

_creates = 0
_nodes: Optional[List[Dict[str, Any]]] = None
_nodes_at = 0.0


def actor_request(options: Dict[str, Any]) -> Dict[str, Dict[str, float]]:
    """What Ray reserves for an actor created with ``options`` (``ActorClass._remote``'s
    merged options): ``{'resources': for its lifetime, 'placement': to place it}``, resource
    name -> amount (memory in bytes). The defaults of Ray 2.60 (``actor.py``): no resource
    given -> 0 CPU for its lifetime, 1 CPU to place it; any given -> 1 CPU unless set."""
    res: Dict[str, float] = {str(k): float(v) for k, v in (options.get("resources") or {}).items()}
    for key, name in (
        ("num_cpus", "CPU"),
        ("num_gpus", "GPU"),
        ("memory", "memory"),
        ("object_store_memory", "object_store_memory"),
    ):
        if options.get(key) is not None:
            res[name] = float(options[key])
    if options.get("accelerator_type"):
        res["accelerator_type:%s" % options["accelerator_type"]] = 0.001
    if not set(res) - {"memory", "object_store_memory"}:
        res.setdefault("CPU", 0.0)
        place = dict(res, CPU=res["CPU"] + 1.0)
    else:
        res.setdefault("CPU", 1.0)
        place = dict(res)
    return {"resources": res, "placement": place}


def _placement_group(options: Dict[str, Any]) -> Tuple[Optional[str], Optional[int]]:
    strat = options.get("scheduling_strategy")
    pg = getattr(strat, "placement_group", None) or options.get("placement_group")
    idx = getattr(strat, "placement_group_bundle_index", options.get("placement_group_bundle_index"))
    pid = getattr(pg, "id", None)
    if pid is None or pg == "default":
        return None, None
    try:
        return pid.hex(), (int(idx) if idx is not None else None)
    except Exception:
        return None, None


def fits(request: Dict[str, float], node: Dict[str, float]) -> bool:
    """True when ``node`` (resource -> total) has every amount ``request`` asks."""
    return all(node.get(k, 0.0) + 1e-9 >= v for k, v in request.items() if v > 0)


def _cluster_nodes(ray: Any, request: Dict[str, float]) -> None:
    """Record ``ray.nodes()`` (alive nodes, total resources) once, and again (at most every
    NODES_REFRESH_S) when ``request`` fits none of the nodes known."""
    global _nodes, _nodes_at
    now = time.monotonic()
    if _nodes is not None and (
        any(fits(request, n["resources"]) for n in _nodes) or now - _nodes_at < NODES_REFRESH_S
    ):
        return
    _nodes_at = now
    nodes = [
        {
            "node_id": n.get("NodeID"),
            "host": n.get("NodeManagerHostname"),
            "resources": {str(k): float(v) for k, v in (n.get("Resources") or {}).items()},
        }
        for n in ray.nodes()
        if n.get("Alive")
    ]
    _nodes = nodes
    rec = RC._recorder()
    if rec is not None:
        rec.set_meta(ray_cluster_nodes=nodes, ray_cluster_wall_ns=time.time_ns())


def note_create(ray: Any, actor_class: Any, handle: Any, options: Dict[str, Any]) -> None:
    """Write the ``ray_actor_create`` event of a new actor (and the cluster's nodes once)."""
    global _creates
    try:
        rec = RC._recorder()
        if rec is None or _creates >= MAX_CREATES:
            return
        _creates += 1
        if rec.full_slots and not getattr(rec, "library_actor", False):  # (Ray Train's controller: small)
            rec.grow("creates Ray actors")
        meta = getattr(actor_class, "__ray_metadata__", None)
        req = actor_request(options)
        pg, bundle = _placement_group(options)
        rec.event(
            "ray_actor_create",
            actor_id=handle._ray_actor_id.hex(),
            cls=str(getattr(meta, "class_name", "") or ""),
            name=options.get("name") or "",
            namespace=options.get("namespace") or "",
            resources=req["resources"],
            placement=req["placement"],
            placement_group=pg,
            bundle_index=bundle,
        )
        _cluster_nodes(ray, req["placement"])
    except Exception as e:
        RC._say("ray: recording an actor creation failed: %r" % (e,), "ray-create")
