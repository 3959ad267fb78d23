"""Ray's own record of actors and worker processes, joined to the traced processes.

:func:`fetch` reads, from a connected Ray driver (``ray.init(address=...)`` done by the
caller), every actor (``actor_id``, ``class_name``, ``name``, ``state``, ``pid``,
``node_id``, ``death_cause``) and every worker process (``worker_id``, ``pid``,
``node_id``, ``is_alive``, ``exit_type``, ``exit_detail``,
``memory_used_bytes_at_death``). Two sources, tried in order; the one used is returned in
``['source']``:

* ``'state-api'``: the public ``ray.util.state.list_actors/list_workers(detail=True)``.
  It goes through the dashboard's HTTP API server, so it fails on clusters started
  without the dashboard (``include_dashboard=False``; Ray 2.60: "Failed to connect to API
  server").
* ``'gcs'`` (fallback): the GCS tables through ``ray._private.state.state`` (private,
  Ray 2.x: ``actor_table(None)`` and ``global_state_accessor.get_worker_table()``, the
  ``gcs_pb2.ActorTableData`` / ``WorkerTableData`` protobufs). Needs no dashboard.

``rayjoin.joined`` adds what it returns to the traced processes; ``rayjoin.death_text``
gives Ray's text of a death cause. Plain data out; only ``fetch`` talks to Ray.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from hangtrace.tracer.collect.ray.rayjoin import death_text

__all__ = ["fetch"]


#: Rows asked of Ray's state API per list: its server refuses more than 10,000 (Ray 2.60:
#: "Given limit 100000 exceeds the supported limit 10000", ``RAY_MAX_LIMIT_FROM_API_SERVER``).
_LIMIT = 10000

#: One actor, worker, task or placement group (keys: see the module doc and ``fetch``).
Row = Dict[str, Any]


def _hex(v: Any) -> Optional[str]:
    if v is None:
        return None
    if isinstance(v, (bytes, bytearray)):
        return v.hex()
    return str(v)


def _as_dict(x: Any) -> Dict[str, Any]:
    return x if isinstance(x, dict) else dict(x.__dict__)


#: Task states worth keeping (finished tasks are many and say nothing about a hang);
#: Ray 2.x ``TaskStatus`` names.
_LIVE_TASK_STATES = frozenset(
    (
        "PENDING_ARGS_AVAIL",
        "PENDING_NODE_ASSIGNMENT",
        "PENDING_OBJ_STORE_MEM_AVAIL",
        "PENDING_ARGS_FETCH",
        "SUBMITTED_TO_WORKER",
        "PENDING_ACTOR_TASK_ARGS_FETCH",
        "PENDING_ACTOR_TASK_ORDERING_OR_CONCURRENCY",
        "RUNNING",
        "RUNNING_IN_RAY_GET",
        "RUNNING_IN_RAY_WAIT",
        "FAILED",
    )
)


def _tasks_from_state_api(timeout_s: float, address: Optional[str] = None) -> List[Row]:
    """Live (pending, running) and failed tasks: task_id, name, state, actor_id,
    parent_task_id, type, func_or_class_name, required_resources, worker_pid, node_id,
    error_type, error_message (truncated), creation/start time (ms since the epoch)."""
    from ray.util.state import list_tasks

    out: List[Row] = []
    for row in list_tasks(
        address=address,
        detail=True,
        limit=_LIMIT,
        timeout=int(max(1, timeout_s)),
        raise_on_missing_output=False,
    ):
        t = _as_dict(row)
        if t.get("state") not in _LIVE_TASK_STATES:
            continue
        out.append(
            {
                k: t.get(k)
                for k in (
                    "task_id",
                    "name",
                    "state",
                    "actor_id",
                    "parent_task_id",
                    "type",
                    "func_or_class_name",
                    "required_resources",
                    "worker_pid",
                    "node_id",
                    "error_type",
                    "creation_time_ms",
                    "start_time_ms",
                    "placement_group_id",
                )
            }
        )
        out[-1]["error_message"] = (t.get("error_message") or "")[:2000] or None
    return out


def _placement_groups_from_state_api(timeout_s: float, address: Optional[str] = None) -> List[Row]:
    from ray.util.state import list_placement_groups

    out: List[Row] = []
    for row in list_placement_groups(
        address=address,
        detail=True,
        limit=_LIMIT,
        timeout=int(max(1, timeout_s)),
        raise_on_missing_output=False,
    ):
        g = _as_dict(row)
        bundles: List[Any] = []
        for b in g.get("bundles") or ():
            b = _as_dict(b)
            bundles.append(b.get("unit_resources") or b.get("resources") or b)
        out.append(
            {
                "placement_group_id": g.get("placement_group_id"),
                "name": g.get("name"),
                "state": g.get("state"),
                "strategy": g.get("topology_strategy") or g.get("strategy"),
                "bundles": bundles,
            }
        )
    return out


def _cluster_resources() -> Tuple[Dict[str, float], Dict[str, float]]:
    """``(total, available)`` resource dicts of the connected cluster (``ray.cluster_resources``)."""
    import ray

    return dict(ray.cluster_resources()), dict(ray.available_resources())


def _same_cluster(timeout_s: float, address: Optional[str]) -> None:
    """Raise unless the state API at ``address`` serves the connected cluster.

    The API server's URL comes from the GCS, which keeps ``127.0.0.1:8265`` even when the
    cluster runs without a dashboard (Ray 2.60): another cluster's dashboard on that port
    (several sessions on one host) would answer for it. Its nodes must be ours.
    """
    import ray
    from ray.util.state import list_nodes

    ours = {n.get("NodeID") for n in ray.nodes()}
    theirs = {
        _as_dict(n).get("node_id")
        for n in list_nodes(
            address=address, limit=_LIMIT, timeout=int(max(1, timeout_s)), raise_on_missing_output=False
        )
    }
    if not theirs & ours:
        raise RuntimeError(
            "the state API answering for %s serves another Ray cluster (the dashboard of this "
            "cluster is off or elsewhere)" % (address or "auto")
        )


def _from_state_api(timeout_s: float, address: Optional[str] = None) -> Tuple[List[Row], List[Row]]:
    from ray.util.state import list_actors, list_workers

    _same_cluster(timeout_s, address)
    actors: List[Row] = []
    for row in list_actors(
        address=address,
        detail=True,
        limit=_LIMIT,
        timeout=int(max(1, timeout_s)),
        raise_on_missing_output=False,
    ):
        a = row if isinstance(row, dict) else dict(row.__dict__)
        actors.append(
            {
                "actor_id": a.get("actor_id"),
                "class_name": a.get("class_name"),
                "name": a.get("name"),
                "state": a.get("state"),
                "pid": a.get("pid"),
                "node_id": a.get("node_id"),
                "job_id": a.get("job_id"),
                "death_cause": a.get("death_cause"),
                "death_text": death_text(a.get("death_cause")),
                "required_resources": a.get("required_resources"),
                "placement_group_id": a.get("placement_group_id"),
                "num_restarts": a.get("num_restarts"),
            }
        )
    workers: List[Row] = []
    for wrow in list_workers(
        address=address,
        detail=True,
        limit=_LIMIT,
        timeout=int(max(1, timeout_s)),
        raise_on_missing_output=False,
    ):
        w = wrow if isinstance(wrow, dict) else dict(wrow.__dict__)
        workers.append(
            {
                "worker_id": w.get("worker_id"),
                "pid": w.get("pid"),
                "node_id": w.get("node_id"),
                "is_alive": w.get("is_alive"),
                "exit_type": w.get("exit_type"),
                "exit_detail": w.get("exit_detail"),
                "worker_type": w.get("worker_type"),
                "job_id": w.get("job_id"),
                "memory_used_bytes_at_death": None,
            }
        )
    return actors, workers


def _from_gcs() -> Tuple[List[Row], List[Row]]:
    from google.protobuf.json_format import MessageToDict
    from ray._private import state as rstate
    from ray.core.generated import common_pb2 as _common_pb2, gcs_pb2 as _gcs_pb2

    # Any: a private API that differs between Ray versions, and generated protobuf modules
    # whose message classes are built at import time (no static attributes to check)
    st: Any = rstate.state
    common_pb2: Any = _common_pb2
    gcs_pb2: Any = _gcs_pb2
    accessor = (
        st._connect_and_get_accessor()
        if hasattr(st, "_connect_and_get_accessor")
        else st.global_state_accessor
    )
    actors: List[Row] = []
    for raw in accessor.get_actor_table(None, None):
        a = gcs_pb2.ActorTableData.FromString(raw)
        cause = (
            MessageToDict(a.death_cause, preserving_proto_field_name=True)
            if a.HasField("death_cause")
            else None
        )
        actors.append(
            {
                "actor_id": a.actor_id.hex(),
                "class_name": a.class_name,
                "name": a.name,
                "state": gcs_pb2.ActorTableData.ActorState.Name(a.state),
                "pid": a.pid,
                "node_id": (a.node_id or a.address.node_id).hex() or None,
                "job_id": a.job_id.hex(),
                "death_cause": cause,
                "death_text": death_text(cause),
                "required_resources": dict(a.required_resources) or None,
            }
        )
    workers: List[Row] = []
    for raw in accessor.get_worker_table():
        w = gcs_pb2.WorkerTableData.FromString(raw)
        exit_type = None
        if w.HasField("exit_type"):
            exit_type = common_pb2.WorkerExitType.Name(w.exit_type)
        workers.append(
            {
                "worker_id": w.worker_address.worker_id.hex(),
                "pid": w.pid,
                "node_id": w.worker_address.node_id.hex() or None,
                "is_alive": w.is_alive,
                "exit_type": exit_type,
                "exit_detail": w.exit_detail if w.HasField("exit_detail") else None,
                "worker_type": common_pb2.WorkerType.Name(w.worker_type),
                "job_id": w.job_id.hex(),
                "memory_used_bytes_at_death": w.memory_used_bytes_at_death or None,
            }
        )
    return actors, workers


def fetch(
    timeout_s: float = 10.0, source: Optional[str] = None, address: Optional[str] = None
) -> Dict[str, Any]:
    """Ray's actor and worker tables from the connected cluster.

    Returns ``{'source': 'state-api'|'gcs'|None, 'actors': [...], 'workers': [...],
    'tasks': [...], 'placement_groups': [...], 'cluster_resources': {name: amount} | None,
    'available_resources': {...} | None, 'errors': [str]}`` (keys of the items: see the
    module doc and ``_tasks_from_state_api``; tasks and placement groups only through the
    state API). ``source`` forces one source. ``address``: the connected cluster's GCS
    address, for the state API (without it Ray picks a cluster of this host by itself,
    and fails when there are several). Never raises: failures are lines in ``errors``.
    """
    out: Dict[str, Any] = {
        "source": None,
        "actors": [],
        "workers": [],
        "tasks": [],
        "placement_groups": [],
        "cluster_resources": None,
        "available_resources": None,
        "errors": [],
    }
    order = [source] if source else ["state-api", "gcs"]
    for src in order:
        try:
            if src == "state-api":
                actors, workers = _from_state_api(timeout_s, address)
            else:
                actors, workers = _from_gcs()
        except Exception as e:
            out["errors"].append("Ray %s unavailable: %s" % (src, _why(e)))
            continue
        out.update(source=src, actors=actors, workers=workers)
        break
    if out["source"] == "state-api":  # tasks and placement groups: the state API only
        for key, fn in (
            ("tasks", _tasks_from_state_api),
            ("placement_groups", _placement_groups_from_state_api),
        ):
            try:
                out[key] = fn(timeout_s, address)
            except Exception as e:
                out["errors"].append("Ray %s unavailable: %s" % (key, _first_line(e)))
    try:
        out["cluster_resources"], out["available_resources"] = _cluster_resources()
    except Exception as e:
        out["errors"].append("Ray cluster resources unavailable: %s" % _first_line(e))
    return out


def _why(e: BaseException) -> str:
    """``_first_line``, and for a missing API server what it means here."""
    line = _first_line(e)
    if "Failed to connect to API server" in str(e) or "Failed to make request" in str(e):
        line = (
            "no dashboard API server (the cluster was started without the dashboard, e.g. "
            "include_dashboard=False): actors and workers come from the GCS; tasks and placement groups "
            "are not available (%s)" % line[:160]
        )
    return line


def _first_line(e: BaseException) -> str:
    return str(e).splitlines()[0][:300] if str(e) else repr(e)
