"""One Ray node's part of a cluster-wide collection: runs inside a pinned Ray task.

In: the run directory on this node (its ring files, faulthandler files), this node's
id and raylet pid, /proc of this host (the raylet's children, their ``HANGTRACE_DIR``).
Out: ``collect_node`` -> a ``NodeResult`` dict of bytes/str (rings, stacks, signals,
process states, Flight Recorder dumps, errors) that ``raycluster.write_ray_snapshot``
writes into one snapshot folder; ``discover_node`` -> the run directories of this node's
traced Ray workers. Which processes are this node's: ``raycluster.py``'s docstring.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import tempfile
import time
from typing import Any, Dict, List, Optional, Set

import orjson

from hangtrace.tracer import config
from hangtrace.tracer.errors import HangtraceError
from hangtrace.tracer.snapshot import ProcessInfo

__all__ = ["collect_node", "discover_node"]

#: What one node's collector task returns (see ``collect_node``).
NodeResult = Dict[str, Any]


def _raylet_children(raylet_pid: int) -> List[int]:
    out: List[int] = []
    for d in glob.glob("/proc/[0-9]*"):
        try:
            with open(d + "/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == raylet_pid:
            out.append(int(d[6:]))
    return out


def discover_node(raylet_pid: Optional[int] = None) -> Dict[str, Any]:
    """Run directories (``HANGTRACE_DIR``) of the traced Ray workers of this node.

    Returns ``{'host', 'dirs': [str]}``. Runs inside a Ray task (``raylet_pid`` defaults
    to the task's parent).
    """
    raylet_pid = raylet_pid or os.getppid()
    dirs: set[str] = set()
    key = (config.DIR + "=").encode()
    for pid in _raylet_children(raylet_pid):
        try:
            with open("/proc/%d/environ" % pid, "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        for item in env:
            if item.startswith(key):
                dirs.add(item[len(key) :].decode("utf-8", "replace"))
    return {"host": socket.gethostname(), "dirs": sorted(d for d in dirs if os.path.isdir(d))}


def _on_node(p: ProcessInfo, node_id: Optional[str], raylet_pid: int, host: str) -> bool:
    m = p.meta or {}
    nid = m.get("ray_node_id")
    if nid:
        return nid == node_id
    if p.host != host:
        return False
    ppid = _ring_ppid(p.ring_path)
    if ppid == raylet_pid:
        return True
    # a worker of another raylet of this host belongs to that node; anything else (the
    # driver, a launcher) is reported by every node of this host, the caller keeps one copy
    return not (ppid and _is_raylet(ppid))


def _is_raylet(pid: int) -> bool:
    try:
        with open("/proc/%d/comm" % pid, "rb") as f:
            return f.read().strip() == b"raylet"
    except OSError:
        return False


def _ring_ppid(path: Optional[str]) -> Optional[int]:
    if path is None:
        return None
    try:
        from hangtrace.tracer.ring import layout as F
        from hangtrace.tracer.ring import reader as R

        with open(path, "rb") as f:
            return R.read_header(f.read(F.HEADER_SIZE), path).get("ppid")
    except Exception:
        return None


def collect_node(
    run_dir: str,
    node_id: Optional[str] = None,
    native: bool = False,
    with_stacks: bool = True,
    raylet_pid: Optional[int] = None,
) -> NodeResult:
    """Collect this node's part of the run in ``run_dir`` (runs inside a pinned Ray task).

    Returns a dict: ``node_id, host, raylet_pid, run_dir, took_s, errors: [str],
    rings: {file name: bytes}, stacks: {file name: bytes (JSON)}, signals: {file name:
    [wall_ns, text]}, processes: {"host:pid": {state, exit_code, rank, stack_error}}``.
    Never raises for missing or unreadable files (they become ``errors`` lines).
    """
    from hangtrace.tracer.collect.ringprocs import load_rings
    from hangtrace.tracer.ring import reader as R

    t0 = time.time()
    host = socket.gethostname()
    raylet_pid = raylet_pid or os.getppid()
    if node_id is None:
        try:
            import ray

            node_id = ray.get_runtime_context().get_node_id()
        except Exception:
            node_id = None
    out: NodeResult = {
        "node_id": node_id,
        "host": host,
        "raylet_pid": raylet_pid,
        "run_dir": run_dir,
        "errors": [],
        "rings": {},
        "stacks": {},
        "signals": {},
        "processes": {},
        "took_s": 0.0,
    }
    if not os.path.isdir(run_dir):
        out["errors"].append("node %s (%s): run directory %s does not exist there" % (node_id, host, run_dir))
        return out
    procs, errors = load_rings(run_dir)
    out["errors"].extend("node %s: %s" % ((node_id or "?")[:12], e) for e in errors)
    mine = [p for p in procs if _on_node(p, node_id, raylet_pid, host)]
    tmp = tempfile.mkdtemp(prefix="hangtrace-raycollect-")
    try:
        for p in mine:
            assert p.ring_path is not None  # load_rings reads every process from its ring
            name = os.path.basename(p.ring_path)
            dst = os.path.join(tmp, name)
            try:
                R.compact_copy(p.ring_path, dst)
                with open(dst, "rb") as f:
                    out["rings"][name] = f.read()
            except (HangtraceError, OSError) as e:
                out["errors"].append("%s: %s" % (p.ring_path, e))
            for kind, s in (p.signals or {}).items():
                out["signals"][os.path.basename(s["path"])] = [s["wall_ns"], s["text"]]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if with_stacks:
        from hangtrace.tracer.collect.frrequest import SNAPSHOT_FR_TIMEOUT_S, fr_files
        from hangtrace.tracer.collect.livestacks import gap_lines, stacks_for

        try:
            mine = stacks_for(mine, native, run_dir)
        except Exception as e:
            out["errors"].append("node %s: stacks failed: %s" % ((node_id or "?")[:12], e))
        silent: Set[int] = set()
        out["fr"] = fr_files(run_dir, [p.pid for p in mine if p.state == "alive" and p.host == host], silent)
        out["errors"].extend(
            "node %s: %s" % ((node_id or "?")[:12], g)
            for g in gap_lines(mine, host, silent, SNAPSHOT_FR_TIMEOUT_S)
        )
    for p in mine:
        if p.stacks is not None:
            out["stacks"]["%s-%d.json" % (p.host, p.pid)] = orjson.dumps(
                {
                    "threads": p.stacks,
                    "source": p.stack_source,
                    "error": p.stack_error,
                    "children": list(p.children),
                }
            )
        out["processes"][p.key] = {
            "state": p.state,
            "exit_code": p.exit_code,
            "rank": p.rank,
            "stack_error": p.stack_error,
            "node_id": node_id,
        }
    out["took_s"] = time.time() - t0
    return out
