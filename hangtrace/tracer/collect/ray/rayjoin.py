"""Ray's own record joined to the traced processes. Pure (no Ray calls).

In: the processes (``snapshot.ProcessInfo``) and Ray's state as ``raystate.fetch`` returns
it (actors, workers). Out: :func:`joined` returns the processes with what Ray says added to
``ProcessInfo.meta`` of the matching traced processes (by ``meta['ray_actor_id']``, else by
pid on the same Ray node): ``ray_actor_state``, ``ray_death`` (Ray's death text,
verbatim), ``ray_death_cause`` (the structured cause), ``ray_exit_type``,
``ray_exit_detail``, and the actor's class and name when the ring lacks them.
:func:`death_text` is Ray's human text of a death cause (used by ``raystate.fetch``).

The analysis reports ``ray_death`` as "Ray says: ..." beside, never instead of, the cause
its own evidence supports: Ray gives the same text for a SIGKILL, a cgroup OOM-kill, a
segfault and an abort (measured on Ray 2.60).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Tuple

from hangtrace.tracer.snapshot import ProcessInfo

__all__ = ["joined", "death_text"]


def death_text(cause: Any) -> Optional[str]:
    """Ray's human text from a death-cause dict (state API or GCS), or None.

    Looks for ``error_message`` (``actor_died_error_context``, ``creation_task_failure_
    context``, ``runtime_env_failed_context``, ...) at any depth; the first found wins.
    """
    if not cause:
        return None
    if isinstance(cause, str):
        return cause
    stack: List[Any] = [cause]
    while stack:
        c = stack.pop(0)
        if isinstance(c, dict):
            for k, v in c.items():
                if k in ("error_message", "errorMessage") and v:
                    return str(v)
            stack.extend(v for v in c.values() if isinstance(v, (dict, list)))
        elif isinstance(c, list):
            stack.extend(c)
    return None


def joined(processes: List[ProcessInfo], state: Optional[Dict[str, Any]]) -> Tuple[List[ProcessInfo], int]:
    """``processes`` with Ray's record of each (``state``, see ``fetch``) added to its ``meta``
    (new ProcessInfo values; the inputs are not changed), and the number matched.

    Matching: by ``meta['ray_actor_id']``, else by pid on the same Ray node; processes
    without any ``ray_*`` meta are never matched (pids of other hosts could collide).
    Pure (no Ray calls).
    """
    out = []
    n = 0
    if not state:
        return list(processes), 0
    by_actor = {a.get("actor_id"): a for a in state.get("actors") or () if a.get("actor_id")}
    by_pid: Dict[Tuple[str, int], List[Dict[str, Any]]] = {}
    for a in state.get("actors") or ():
        if a.get("pid"):
            by_pid.setdefault(("a", a["pid"]), []).append(a)
    for w in state.get("workers") or ():
        if w.get("pid"):
            by_pid.setdefault(("w", w["pid"]), []).append(w)
    for p in processes:
        m = dict(p.meta or {})
        if _join_one(p.pid, m, state, by_actor, by_pid):
            n += 1
            p = dataclasses.replace(p, meta=m)
        out.append(p)
    return out, n


def _join_one(
    pid: int,
    m: Dict[str, Any],
    state: Dict[str, Any],
    by_actor: Dict[Any, Dict[str, Any]],
    by_pid: Dict[Tuple[str, int], List[Dict[str, Any]]],
) -> bool:
    """Fill ``m`` (one process's meta) from ``state``; True when Ray knows the process."""
    if not any(str(k).startswith("ray_") for k in m):
        return False  # not a Ray process: pids of other hosts could collide
    node = m.get("ray_node_id")

    def pick(kind: str) -> Optional[Dict[str, Any]]:
        cands = by_pid.get((kind, pid)) or []
        if node:
            cands = [c for c in cands if not c.get("node_id") or c.get("node_id") == node]
        # the newest incarnation last (restarted actors reuse nothing, but be safe)
        return cands[-1] if cands else None

    actor = by_actor.get(m.get("ray_actor_id")) or pick("a")
    worker = pick("w")
    if actor is None and worker is None:
        return False
    if actor is not None:
        m["ray_actor_state"] = actor.get("state")
        if actor.get("class_name") and not m.get("ray_actor_class"):
            m["ray_actor_class"] = actor["class_name"]
        if actor.get("name") and not m.get("ray_actor_name"):
            m["ray_actor_name"] = actor["name"]
        if not m.get("ray_actor_id"):
            m["ray_actor_id"] = actor.get("actor_id")
        if actor.get("state") == "DEAD" or actor.get("death_cause"):
            m["ray_death_cause"] = actor.get("death_cause")
            if actor.get("death_text"):
                m["ray_death"] = actor["death_text"]
    if worker is not None:
        m["ray_worker_alive"] = worker.get("is_alive")
        if worker.get("exit_type"):
            m["ray_exit_type"] = worker.get("exit_type")
        if worker.get("exit_detail"):
            m["ray_exit_detail"] = worker.get("exit_detail")
        if worker.get("memory_used_bytes_at_death"):
            m["ray_memory_used_bytes_at_death"] = worker["memory_used_bytes_at_death"]
        if not m.get("ray_death") and worker.get("is_alive") is False and worker.get("exit_detail"):
            m["ray_death"] = "worker exit %s: %s" % (worker.get("exit_type"), worker.get("exit_detail"))
    m["ray_state_source"] = state.get("source")
    return True
