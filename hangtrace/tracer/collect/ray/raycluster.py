"""Cluster-wide collection on Ray: one collector task pinned to every alive node.

``hangtrace dump --ray [--address ADDR] [RUN_DIR]`` calls :func:`dump_cluster`. It
connects to the cluster as a driver (tracing stripped: ``HANGTRACE_HELPER=1`` in the
job's runtime env), and starts :func:`collect_node` once per alive node with
``NodeAffinitySchedulingStrategy(node_id, soft=False)`` and ``num_cpus=0`` (so it runs
even when the job holds every CPU). Each task, on its node (``raynode.py``):

* selects the traced processes of **its node**: ring files in ``RUN_DIR`` whose ring
  meta ``ray_node_id`` is the node's id, or, without a node id (a worker that never ran
  an actor method yet), whose parent pid is the node's raylet (a Ray worker's parent is
  the raylet that started it: the collector task's own ``os.getppid()``), or, neither,
  non-Ray traced processes of the same host (the driver; de-duplicated by the caller).
  This holds on a single host running several Ray nodes (``ray.cluster_utils.Cluster``),
  where host names and the run directory are shared;
* copies the used part of each selected ring, reads the faulthandler files, records
  process states (checked there, where the pids live), takes py-spy stacks of the
  alive ones (faulthandler fallback, as ``collect.take_snapshot``) and asks their agents
  for Flight Recorder dumps and pending asyncio tasks (``frrequest.fr_files``);
* returns all of it as one dict of bytes/str to the caller.

The caller writes every node's payload into one local snapshot folder
(``RUN_DIR/snapshots/<UTC time>-ray/`` when RUN_DIR exists locally, else
``./hangtrace-ray-<UTC time>/``) in the layout ``collect.load_snapshot`` reads, adds
``ray_nodes.json`` (per node: id, host, files, errors, seconds) and ``ray_state.json``
(``raystate.fetch``), joins Ray's actor/worker records into the processes
(``rayjoin.joined``) and returns the Snapshot for the analysis.

Without RUN_DIR (and no ``HANGTRACE_DIR``), each node task first looks for the run
directories of its Ray workers (``HANGTRACE_DIR`` in ``/proc/PID/environ`` of the
raylet's children: runtime_env env vars are in the worker's initial environment); one
directory across the cluster is used, several are an error listing them.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import orjson

from hangtrace.tracer import config
from hangtrace.tracer.errors import HangtraceError, RunDirError
from hangtrace.tracer.collect.ray.raynode import NodeResult, collect_node, discover_node
from hangtrace.tracer.snapshot import Snapshot

__all__ = ["dump_cluster", "load_ray_snapshot"]

#: A node of ``ray.nodes()``.
RayNode = Dict[str, Any]

#: Seconds to wait for the node tasks (all of them together).
DEFAULT_TIMEOUT_S = 120.0


def _connect(address: Optional[str]) -> bool:
    """Connect as a driver unless already connected (returns whether this call did).

    Token authentication (Ray 2.60's default) is set up first by ``rayauth.plan`` /
    ``apply``: Ray sends its token by itself only for ``address='auto'``.
    """
    import ray
    from hangtrace.tracer.collect.ray import rayauth

    if ray.is_initialized():
        return False
    env = {config.HELPER: "1", config.ENABLE: "0"}
    address = address or os.environ.get("RAY_ADDRESS") or "auto"
    auth = rayauth.plan(address)
    rayauth.apply(auth)
    try:
        ray.init(
            address=address,
            log_to_driver=False,
            runtime_env={"env_vars": env},
            namespace="hangtrace",
            logging_level="ERROR",  # type: ignore[arg-type]  # Ray annotates int; it takes level names too
        )
    except (ConnectionError, RuntimeError, ray.exceptions.RayError) as e:
        from hangtrace.tracer.collect.ray.raygcs import gcs_unreachable

        tcp_ok = None if address == "auto" or "://" in address else gcs_unreachable(address, 3.0) is None
        raise HangtraceError(
            "cannot connect to the Ray cluster at %s: %s (token auth: %s)"
            % (address, str(e).splitlines()[0] if str(e) else type(e).__name__, auth.why),
            rayauth.connect_remedy(auth, tcp_ok),
        ) from None
    return True


def _alive_nodes() -> List[RayNode]:
    import ray

    return [n for n in ray.nodes() if n.get("Alive")]


def _run_on_nodes(
    fn: Callable[..., NodeResult],
    nodes: List[RayNode],
    args_for: Callable[[str], Tuple[Any, ...]],
    timeout_s: float,
) -> Tuple[Dict[str, NodeResult], List[str]]:
    """Run ``fn`` once per node (pinned, hard affinity); returns ({node_id: result}, errors)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0, max_retries=0)(fn)
    refs: Dict[Any, str] = {}  # ObjectRef -> node id
    for n in nodes:
        nid = n["NodeID"]
        refs[
            task.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(nid, soft=False), name="hangtrace-collect"
            ).remote(*args_for(nid))
        ] = nid
    done, pending = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
    results: Dict[str, NodeResult] = {}
    errors: List[str] = []
    for ref in done:
        nid = refs[ref]
        try:
            results[nid] = ray.get(ref)
        except Exception as e:
            errors.append(
                "node %s: collector task failed: %s" % (nid, str(e).splitlines()[0] if str(e) else repr(e))
            )
    for ref in pending:
        errors.append(
            "node %s: collector task did not finish in %.0f s (node overloaded or unreachable); "
            "its processes are missing" % (refs[ref], timeout_s)
        )
        try:
            ray.cancel(ref, force=True)
        except Exception:
            pass
    return results, errors


def _stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + ".%03d" % (time.time_ns() // 1000000 % 1000)


def dump_cluster(
    run_dir: Optional[str] = None,
    address: Optional[str] = None,
    native: bool = False,
    with_stacks: bool = True,
    out_dir: Optional[str] = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    state_source: Optional[str] = None,
    reason: str = "request",
) -> Snapshot:
    """Collect the run on every alive Ray node, store one snapshot locally, join Ray state.

    ``run_dir``: the run directory path (the same on every node; default
    ``HANGTRACE_DIR``, else discovered on the nodes). ``address``: Ray address (default
    ``RAY_ADDRESS``, else ``'auto'``); an already connected driver is reused.
    ``out_dir``: where the snapshot folder goes (default: ``RUN_DIR/snapshots`` if RUN_DIR
    exists here, else the current directory). ``reason``: stored in ``processes.json``
    ('request', or the watcher's 'stall' / 'death'). Returns the ``Snapshot`` (``path`` set).
    Raises HangtraceError (cannot connect), RunDirError (no run dir / no process found).
    """
    import ray

    t0 = time.time()
    connected = _connect(address)
    try:
        nodes = _alive_nodes()
        run_dir = run_dir or os.environ.get(config.DIR)
        errors: List[str] = []
        if not run_dir:
            found, errs = _run_on_nodes(discover_node, nodes, lambda nid: (), timeout_s)
            errors += errs
            dirs = sorted({d for r in found.values() for d in r["dirs"]})
            if not dirs:
                raise RunDirError(
                    "no traced Ray worker found on %d node(s)" % len(nodes),
                    "pass RUN_DIR (the HANGTRACE_DIR of the job's runtime_env)",
                )
            if len(dirs) > 1:
                raise RunDirError(
                    "several runs are traced on this cluster: %s" % ", ".join(dirs),
                    "pass one of them as RUN_DIR",
                )
            run_dir = dirs[0]
        results, errs = _run_on_nodes(
            collect_node, nodes, lambda nid: (run_dir, nid, native, with_stacks), timeout_s
        )
        errors += errs
        from hangtrace.tracer.collect.ray import raystate

        state = raystate.fetch(source=state_source, address=ray.get_runtime_context().gcs_address)
    finally:
        if connected:
            try:
                ray.shutdown()
            except Exception:
                pass
    base = out_dir or (os.path.join(run_dir, "snapshots") if os.path.isdir(run_dir) else os.getcwd())
    stamp = _stamp()
    sdir = (
        os.path.join(base, stamp + "-ray")
        if out_dir or os.path.isdir(run_dir)
        else os.path.join(base, "hangtrace-ray-" + stamp)
    )
    write_ray_snapshot(sdir, run_dir, results, errors, state, took_s=time.time() - t0, reason=reason)
    snap = load_ray_snapshot(sdir)
    if not snap.processes:
        raise RunDirError(
            "no traced process of %s found on %d Ray node(s)%s"
            % (run_dir, len(nodes), "; " + "; ".join(snap.errors[:3]) if snap.errors else ""),
            "check HANGTRACE_DIR in the job's runtime_env (hangtrace env --ray) and that the job runs",
        )
    return snap


def write_ray_snapshot(
    sdir: str,
    run_dir: str,
    results: Dict[str, NodeResult],
    errors: Iterable[str],
    state: Optional[Dict[str, Any]],
    took_s: float = 0.0,
    reason: str = "request",
) -> str:
    """Write node payloads (``collect_node`` results by node id) as one snapshot folder."""
    os.makedirs(os.path.join(sdir, "rings"), mode=0o700, exist_ok=True)
    os.makedirs(os.path.join(sdir, "stacks"), mode=0o700, exist_ok=True)
    processes: Dict[str, Dict[str, Any]] = {}
    files: set[str] = set()
    nodes: List[Dict[str, Any]] = []
    errors = list(errors)
    for nid, r in sorted(results.items()):
        errors.extend(r.get("errors") or ())
        for name, data in r["rings"].items():
            if name in files:
                continue
            with open(os.path.join(sdir, "rings", name), "wb") as f:
                f.write(data)
            files.add(name)
        for name, data in r["stacks"].items():
            with open(os.path.join(sdir, "stacks", name), "wb") as f:
                f.write(data)
        if r.get("fr"):
            os.makedirs(os.path.join(sdir, "fr"), mode=0o700, exist_ok=True)
            for name, data in r["fr"].items():
                with open(os.path.join(sdir, "fr", os.path.basename(name)), "wb") as f:
                    f.write(data)
        for name, (wall_ns, text) in r["signals"].items():
            p = os.path.join(sdir, "stacks", name)
            with open(p, "w") as f:
                f.write(text)
            os.utime(p, ns=(wall_ns, wall_ns))
        for key, st in r["processes"].items():
            prev = processes.get(key)
            # a process reported by two nodes of one host (non-Ray): keep the first, but a
            # node that owns it (by node id) wins
            if prev is None or (st.get("node_id") == nid and prev.get("node_id") != nid):
                processes[key] = st
        nodes.append(
            {
                "node_id": nid,
                "host": r.get("host"),
                "raylet_pid": r.get("raylet_pid"),
                "rings": sorted(r["rings"]),
                "took_s": r.get("took_s"),
                "errors": r.get("errors"),
            }
        )
    meta = {
        "run_dir": run_dir,
        "taken_wall_ns": time.time_ns(),
        "reason": reason,
        "errors": errors,
        "processes": processes,
        "collector": "ray",
        "took_s": took_s,
    }
    with open(os.path.join(sdir, "processes.json"), "wb") as f:
        f.write(orjson.dumps(meta, option=orjson.OPT_INDENT_2))
    with open(os.path.join(sdir, "ray_nodes.json"), "wb") as f:
        f.write(orjson.dumps(nodes, option=orjson.OPT_INDENT_2))
    with open(os.path.join(sdir, "ray_state.json"), "wb") as f:
        f.write(orjson.dumps(state, option=orjson.OPT_INDENT_2, default=str))
    return sdir


def load_ray_snapshot(sdir: str) -> Snapshot:
    """``collect.load_snapshot`` plus Ray's records (``ray_state.json``) joined into meta."""
    from hangtrace.tracer.collect.ray import rayjoin
    from hangtrace.tracer.collect.rings import load_snapshot

    snap = load_snapshot(sdir)
    try:
        with open(os.path.join(sdir, "ray_state.json"), "rb") as f:
            state = orjson.loads(f.read())
    except (OSError, ValueError):
        state = None
    errors = list(snap.errors)
    procs = snap.processes
    if state:
        procs, _ = rayjoin.joined(procs, state)
        errors.extend(state.get("errors") or () if not state.get("source") else ())
    try:
        with open(os.path.join(sdir, "ray_nodes.json"), "rb") as f:
            nodes = orjson.loads(f.read())
    except (OSError, ValueError):
        nodes = []
    return dataclasses.replace(
        snap,
        processes=procs,
        errors=errors,
        ray_nodes=nodes if isinstance(nodes, list) else [],
        ray_state=state if isinstance(state, dict) else {},
    )
