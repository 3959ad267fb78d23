"""Ray's own account of a process's death, for the verdict to quote beside ours (pure).

Two sources, in order: Ray's state API joined to the process while the cluster was up
(``meta['ray_death']``, ``ray_actor_state``, ``ray_exit_type``, ``ray_exit_detail``:
``collect/ray/rayjoin.py``), else Ray's session logs, which outlive the cluster
(``memory_facts['ray_worker_exit']``: the GCS's "Reporting worker exit ... exit_type = T,
exit_detail = D" line, ``collect/ray/raylogs.py``). With the cluster gone only the second
is there: "worker exit SYSTEM_ERROR: The process receives a SIGTERM" is still quoted.
"""

from typing import Any, Dict, Optional

from hangtrace.tracer.snapshot import ProcessInfo


def ray_says(proc: Optional[ProcessInfo]) -> Optional[Dict[str, Any]]:
    """Ray's record of ``proc``'s end: {'text', 'actor_state', 'exit_type', 'exit_detail',
    'source'} ('state-api' or the session log file name), or None when Ray said nothing."""
    if proc is None:
        return None
    m = proc.meta or {}
    if m.get("ray_death"):
        return {
            "text": m["ray_death"],
            "actor_state": m.get("ray_actor_state"),
            "exit_type": m.get("ray_exit_type"),
            "exit_detail": m.get("ray_exit_detail"),
            "source": "state-api",
        }
    x = (proc.memory_facts or {}).get("ray_worker_exit")
    if not isinstance(x, dict) or not (x.get("exit_type") or x.get("exit_detail")):
        return None
    detail = " ".join(str(x.get("exit_detail") or "").split())
    return {
        "text": "worker exit %s: %s" % (x.get("exit_type") or "?", detail or "(no detail)"),
        "actor_state": None,
        "exit_type": x.get("exit_type") or None,
        "exit_detail": detail or None,
        "source": "Ray's session log %s" % (x.get("source") or "gcs_server.out"),
    }
