"""``hangtrace attach``: diagnose a hung job that was not started with hangtrace.

There are no flight records, only what can be seen from outside: the processes'
initial environment (rank, local rank, world size from ``/proc/PID/environ``) and
py-spy stacks of every rank, taken in parallel. The analysis is the same pure
``diagnose()`` on a Snapshot whose processes have stacks and no records; it merges the
stacks (STAT-style prefix tree) and names the outliers in the same vocabulary.
:func:`collect` gathers and stores; ``tracer.pipeline.attach`` diagnoses the Snapshot
(reason 'attach') with ``diagnose()``, whose ``stack_only`` rule
(``analyze/rules/stack_only.py``) gives the stack-only verdict.
"""
import os
import socket
import tempfile
import time

from typing import List, Optional

import orjson

from hangtrace.tracer.collect.discover import find_torch_processes
from hangtrace.tracer.errors import NoProcessesError
from hangtrace.tracer.snapshot import ProcessInfo, Snapshot

#: world sizes above this (from a process environment) are implausible and ignored
_MAX_WORLD = 1 << 20


def collect(pids: Optional[List[int]] = None, native: bool = False, out_dir: Optional[str] = None) -> Snapshot:
    """Find the job's processes (``pids`` or a scan) and take their stacks.

    Returns the Snapshot, stored (processes.json, stacks/*.json) under ``out_dir``
    (default: a new folder ``hangtrace-attach-<time>`` in the temp dir); the pipeline
    (``tracer.pipeline.attach``) diagnoses it. Raises NoProcessesError when no
    torch.distributed process is found (with the reasons of skipped ones).
    """
    from hangtrace.tracer.collect import stacks as S
    found = find_torch_processes(pids)
    notes = []
    if pids is None and found:
        found, notes = _newest_job(found)
    if not found:
        why = "; ".join("pid %s: %s" % (s["pid"], s["reason"]) for s in found.skipped[:5])
        raise NoProcessesError(
            "no torch.distributed process found%s" % (" (" + why + ")" if why else ""),
            "pass --pid PID for each rank, or run as the job's user/root; processes are "
            "recognised by RANK/LOCAL_RANK/WORLD_SIZE/TORCHELASTIC_RUN_ID in their environment")
    res = S.dump_stacks([d["pid"] for d in found], native=native)
    procs = []
    for d in found:
        r = res.get(d["pid"]) or {}
        p = ProcessInfo(host=d["host"], pid=d["pid"], rank=d["rank"], local_rank=d["local_rank"],
                        world_size=d["world_size"], run_id=d["run_id"],
                        state="alive" if r.get("threads") or "vanished" not in (r.get("error") or "") else "killed",
                        stacks=r.get("threads"), stack_source=r.get("source"),
                        stack_error=(r.get("error") or None) and "%s%s" % (
                            r["error"], (" (remedy: %s)" % r["remedy"]) if r.get("remedy") else ""),
                        meta={"cmdline": d["cmdline"], "attached": True})
        procs.append(p)
    errors = notes + ["pid %s skipped: %s" % (s["pid"], s["reason"]) for s in found.skipped]
    errors += ["rank %d (pid %d): no stacks: %s" % (p.rank, p.pid, p.stack_error) for p in procs if p.stack_error]
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    sdir = out_dir or os.path.join(tempfile.gettempdir(), "hangtrace-attach-%s-%d" % (stamp, os.getpid()))
    os.makedirs(os.path.join(sdir, "stacks"), mode=0o700, exist_ok=True)
    snap = Snapshot(run_dir=sdir, taken_wall_ns=time.time_ns(), reason="attach", processes=procs,
                    errors=errors, path=sdir)
    for p in procs:
        if p.stacks is not None:
            with open(os.path.join(sdir, "stacks", "%s-%d.json" % (p.host, p.pid)), "wb") as f:
                f.write(orjson.dumps({"threads": p.stacks, "source": p.stack_source, "error": p.stack_error}))
    meta = {"run_dir": sdir, "taken_wall_ns": snap.taken_wall_ns, "reason": "attach", "errors": errors,
            "host": socket.gethostname(),
            "processes": {p.key: {"state": p.state, "rank": p.rank, "stack_error": p.stack_error}
                          for p in procs}}
    with open(os.path.join(sdir, "processes.json"), "wb") as f:
        f.write(orjson.dumps(meta, option=orjson.OPT_INDENT_2))
    return snap


def _job_key(d):
    e = d.get("env", {})
    return (e.get("TORCHELASTIC_RUN_ID", ""), e.get("MASTER_ADDR", ""), e.get("MASTER_PORT", ""))


def _newest_job(found):
    """Keep the processes of the most recently started job; notes name the others."""
    jobs = {}
    for d in found:
        jobs.setdefault(_job_key(d), []).append(d)
    if len(jobs) <= 1:
        return found, []
    newest = max(jobs.values(), key=lambda ds: max(d.get("start_time") or 0 for d in ds))
    notes = []
    for key, ds in jobs.items():
        if ds is not newest:
            notes.append("another job (MASTER_ADDR:PORT %s:%s%s) with pids %s was left out; pass --pid to "
                         "choose" % (key[1], key[2], (" run id " + key[0]) if key[0] else "",
                                     ",".join(str(d["pid"]) for d in ds[:8])))
    return type(found)(newest, found.skipped), notes
