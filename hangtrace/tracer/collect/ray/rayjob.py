"""Cluster-wide collection of a Ray run from a watcher (``hangtrace run`` or a node watcher).

``ray_collect`` runs ``raycluster.dump_cluster`` in a child process so the watcher never
becomes a Ray driver itself; ``is_ray_run`` tells a Ray run by its rings' metadata;
``raygcs.gcs_unreachable`` checks the Ray GCS address by TCP first (``ray.init`` to an
address nobody listens on retries for minutes). Moved here from watch/watcher.py (issue 8).
"""

from __future__ import annotations

import dataclasses
import glob
import os
import sys
from typing import TYPE_CHECKING, Callable, Optional, Tuple, Union

from hangtrace.tracer import config
from hangtrace.tracer.collect.ray.raygcs import gcs_unreachable
from hangtrace.tracer.collect.ringprocs import RING_GLOB
from hangtrace.tracer.ring import reader as R
from hangtrace.tracer.snapshot import Snapshot

if TYPE_CHECKING:
    import subprocess


def _stderr_log(line: str) -> None:
    sys.stderr.write("hangtrace: %s\n" % line)


def ray_address_of_run(run_dir: str) -> Optional[str]:
    """The Ray GCS address (HOST:PORT) of the cluster this run's Ray workers belong to, or
    None: from the ``--gcs-address`` argument Ray's raylet gives every worker, as recorded
    in the ring's start event. Several clusters can run on one host (``address='auto'``
    would pick one of them, not necessarily this run's)."""
    from hangtrace.hooks.autowatch import ray_gcs_address

    for path in glob.glob(os.path.join(run_dir, RING_GLOB)):
        try:
            ring = R.read_ring(path, records=False)
        except Exception:
            continue
        for e in ring.events:
            if e.get("event") == "start":
                gcs = ray_gcs_address([str(a) for a in e.get("argv") or ()])
                if gcs:
                    return str(gcs)
    return None


def is_ray_run(run_dir: str) -> bool:
    """True when a ring of ``run_dir`` belongs to a Ray worker (Ray node id in its metadata)."""
    for path in glob.glob(os.path.join(run_dir, RING_GLOB)):
        try:
            if R.read_ring(path, records=False).meta.get("ray_node_id"):
                return True
        except Exception:
            continue
    return False


#: Cluster-wide collection of a Ray run (``ray_collect``): seconds allowed to the node
#: tasks, and to the whole collector process (connect, tasks, Ray state) before it is killed.
RAY_TASK_TIMEOUT_S = 60.0
RAY_COLLECT_TIMEOUT_S = 100.0

_RAY_COLLECT_CODE = (
    "import sys\n"
    "from hangtrace.tracer.collect.ray.raycluster import dump_cluster\n"
    "run_dir, address, reason, native, timeout_s = sys.argv[1:6]\n"
    "snap = dump_cluster(run_dir, address=address or None, native=native == '1', timeout_s=float(timeout_s),\n"
    "                    reason=reason)\n"
    "print('SNAPSHOT ' + snap.path, flush=True)\n"
)


#: While the collector runs, the GCS is checked this often (s); two failed checks in a
#: row mean the cluster went away (a driver that started its own cluster with
#: ``ray.init()`` shuts it down when an actor dies: the collector's ``ray.init`` would
#: then retry until ``RAY_COLLECT_TIMEOUT_S``).
GCS_CHECK_S = 2.0


def _wait_collector(
    p: "subprocess.Popen[bytes]", address: str, timeout_s: float
) -> "Union[Tuple[bytes, bytes], str]":
    """``(stdout, stderr)`` of collector ``p`` once it exits, or why it was given up: the
    timeout passed, or the Ray GCS at ``address`` (HOST:PORT) stopped answering."""
    import subprocess
    import time

    deadline = time.monotonic() + timeout_s
    failed = 0
    while True:
        try:
            return p.communicate(timeout=max(0.1, min(GCS_CHECK_S, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            pass
        if time.monotonic() >= deadline:
            return "did not finish in %.0f s" % timeout_s
        why = gcs_unreachable(address, timeout_s=1.0) if address else None
        failed = failed + 1 if why else 0
        if failed >= 2:
            return "gave up: the cluster went away during the collection (%s)" % why


def ray_collect(
    run_dir: str,
    reason: str,
    native: bool = False,
    log: Optional[Callable[[str], None]] = None,
    address: Optional[str] = None,
    timeout_s: float = RAY_COLLECT_TIMEOUT_S,
) -> Optional[Snapshot]:
    """The same cluster-wide collection as ``hangtrace dump --ray``, from a watcher.

    Runs ``raycollect.dump_cluster`` in a child process (tracing stripped, its own session)
    so the watcher never becomes a Ray driver itself: the child is killed after
    ``timeout_s`` seconds, or once the GCS stops answering (``_wait_collector``). ``address``: the Ray GCS address (default ``RAY_ADDRESS``, which
    ``hooks.autowatch`` sets to the cluster of the Ray worker that started the watcher;
    else ``auto``). Returns the Snapshot (``raycollect.load_ray_snapshot``), or None after
    writing one line to ``log`` (callable; default stderr) saying why.
    """
    import signal
    import subprocess

    if log is None:
        log = _stderr_log
    address = address or os.environ.get("RAY_ADDRESS") or ray_address_of_run(run_dir) or ""
    why = gcs_unreachable(address) if address else None
    if why:
        log("cluster-wide collection skipped: Ray unreachable (%s); this node only" % why)
        return None
    p = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _RAY_COLLECT_CODE,
            run_dir,
            address,
            reason,
            "1" if native else "0",
            str(min(RAY_TASK_TIMEOUT_S, max(5.0, timeout_s - 20.0))),
        ],
        env=config.helper_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    got = _wait_collector(p, address, timeout_s)
    if isinstance(got, str):
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
        p.communicate()
        log("cluster-wide collection (Ray at %s) %s; this node only" % (address or "auto", got))
        return None
    out, err = got
    path = None
    for line in out.decode("utf-8", "replace").splitlines():
        if line.startswith("SNAPSHOT "):
            path = line[len("SNAPSHOT ") :].strip()
    if p.returncode != 0 or not path:
        lines = [ln for ln in err.decode("utf-8", "replace").splitlines() if ln.strip()]
        log(
            "cluster-wide collection (Ray at %s) failed (exit %s: %s); this node only"
            % (address or "auto", p.returncode, lines[-1][-500:] if lines else "no output")
        )
        return None
    from hangtrace.tracer.collect.ray.raycluster import load_ray_snapshot

    snap = dataclasses.replace(load_ray_snapshot(path), reason=reason, path=path)
    log(
        "cluster-wide collection (Ray at %s): %d node(s), %d process(es)"
        % (address or "auto", len(getattr(snap, "ray_nodes", None) or ()), len(snap.processes))
    )
    return snap
