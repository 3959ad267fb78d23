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
import shlex
import socket
import sys
import tempfile
import time

from typing import Any, Callable, Dict, List, Optional, Tuple

import orjson

from hangtrace.tracer.collect.discover import find_torch_processes
from hangtrace.tracer.errors import NoProcessesError
from hangtrace.tracer.snapshot import ProcessInfo, ProgressWindow, Snapshot

#: seconds between the two stack samples of ``attach`` (py-spy takes ~10-20 ms per process)
WINDOW_S = 1.0

#: the least seconds between the CPU readings of the two samples
MIN_QUIET_S = 0.5

#: world sizes above this (from a process environment) are implausible and ignored
_MAX_WORLD = 1 << 20


def _stderr(line: str) -> None:
    sys.stderr.write("hangtrace: %s\n" % line)
    sys.stderr.flush()


def collect(
    pids: Optional[List[int]] = None,
    native: bool = False,
    out_dir: Optional[str] = None,
    log: Optional[Callable[[str], None]] = None,
    window_s: float = WINDOW_S,
) -> Snapshot:
    """Find the job's processes (``pids`` or a scan) and take their stacks twice,
    ``window_s`` seconds apart (0: once): the earlier ones in ``earlier_stacks``, the
    interval in ``Snapshot.window`` (one instant cannot tell a hung job from a training
    one; the analysis compares the two, ``analyze/stuck/twosamples.py``).

    Without ``pids``, the job started most recently by this user (``choose_job``); ``log``
    (default stderr) gets one line naming it and why.

    Returns the Snapshot, stored (processes.json, stacks/*.json) under ``out_dir``
    (default: a new folder ``hangtrace-attach-<time>`` in the temp dir); the pipeline
    (``tracer.pipeline.attach``) diagnoses it. Raises NoProcessesError when no
    torch.distributed process is found (with the reasons of skipped ones).
    """
    found = find_torch_processes(pids)
    notes: List[str] = []
    if pids is None and found:
        chosen, line, notes = choose_job(found, os.getuid())
        (log or _stderr)(line)
        found = type(found)(chosen, found.skipped)
    if not found:
        why = "; ".join("pid %s: %s" % (s["pid"], s["reason"]) for s in found.skipped[:5])
        raise NoProcessesError(
            "no torch.distributed process found%s" % (" (" + why + ")" if why else ""),
            "pass --pid PID for each rank, or run as the job's user/root; processes are "
            "recognised by RANK/LOCAL_RANK/WORLD_SIZE/TORCHELASTIC_RUN_ID in their environment",
        )
    first, res, window = _two_samples([d["pid"] for d in found], d0=found, native=native, window_s=window_s)
    procs = []
    for d in found:
        r = res.get(d["pid"]) or {}
        p = ProcessInfo(
            host=d["host"],
            pid=d["pid"],
            rank=d["rank"],
            local_rank=d["local_rank"],
            world_size=d["world_size"],
            run_id=d["run_id"],
            state="alive" if r.get("threads") or "vanished" not in (r.get("error") or "") else "killed",
            stacks=r.get("threads"),
            stack_source=r.get("source"),
            stack_error=(r.get("error") or None)
            and "%s%s" % (r["error"], (" (remedy: %s)" % r["remedy"]) if r.get("remedy") else ""),
            meta={"cmdline": d["cmdline"], "attached": True},
            children=tuple(r.get("children") or ()),
            earlier_stacks=(first.get(d["pid"]) or {}).get("threads"),
        )
        procs.append(p)
    errors = notes + ["pid %s skipped: %s" % (s["pid"], s["reason"]) for s in found.skipped]
    inferred = [d for d in found if d.get("inferred_from") and d["rank"] < 0]
    if inferred:
        errors.append(
            "pid(s) %s: rank unknown: their torch variables were set in Python (os.environ), not in the "
            "environment they started with; found through child pid %d, which inherited them; stacks "
            "taken, no rank-based verdict (set RANK before starting the ranks, or run under HANGTRACE=1)"
            % (", ".join(str(d["pid"]) for d in inferred), inferred[0]["inferred_from"])
        )
    errors += [
        "rank %d (pid %d): no stacks: %s" % (p.rank, p.pid, p.stack_error) for p in procs if p.stack_error
    ]
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    sdir = out_dir or os.path.join(tempfile.gettempdir(), "hangtrace-attach-%s-%d" % (stamp, os.getpid()))
    os.makedirs(os.path.join(sdir, "stacks"), mode=0o700, exist_ok=True)
    snap = Snapshot(
        run_dir=sdir,
        taken_wall_ns=time.time_ns(),
        reason="attach",
        processes=procs,
        errors=errors,
        path=sdir,
        window=window,
    )
    for p in procs:
        if p.stacks is not None:
            with open(os.path.join(sdir, "stacks", "%s-%d.json" % (p.host, p.pid)), "wb") as f:
                f.write(orjson.dumps({"threads": p.stacks, "source": p.stack_source, "error": p.stack_error}))
    meta = {
        "run_dir": sdir,
        "taken_wall_ns": snap.taken_wall_ns,
        "reason": "attach",
        "errors": errors,
        "host": socket.gethostname(),
        "processes": {p.key: {"state": p.state, "rank": p.rank, "stack_error": p.stack_error} for p in procs},
    }
    with open(os.path.join(sdir, "processes.json"), "wb") as f:
        f.write(orjson.dumps(meta, option=orjson.OPT_INDENT_2))
    return snap


Found = Dict[str, Any]


def _two_samples(
    pids: List[int], d0: List[Found], native: bool, window_s: float
) -> Tuple[Dict[int, Any], Dict[int, Any], Optional[ProgressWindow]]:
    """``(first stacks, second stacks, window)``: ``stacks.dump_stacks`` of ``pids`` twice,
    ``window_s`` seconds apart, and each process's CPU demand per second between the two
    (``watch/busy.thread_demand_s`` and ``demand_growth``, read after the first sample and before the second: the
    samples' own ptrace stops are not counted; at least :data:`MIN_QUIET_S` apart); with
    ``window_s`` 0, one sample and no window."""
    from hangtrace.tracer.collect import stacks as S
    from hangtrace.tracer.watch.busy import demand_growth, thread_demand_s

    if window_s <= 0:
        return {}, S.dump_stacks(pids, native=native), None
    t0 = time.monotonic()
    first = S.dump_stacks(pids, native=native)
    c0, tc0 = {pid: thread_demand_s(pid) for pid in pids}, time.monotonic()
    time.sleep(max(MIN_QUIET_S, window_s - (tc0 - t0)))
    c1, tc1 = {pid: thread_demand_s(pid) for pid in pids}, time.monotonic()
    res = S.dump_stacks(pids, native=native)
    host = {d["pid"]: d["host"] for d in d0}
    share = tuple(
        ("%s:%d" % (host[pid], pid), round(demand_growth(a, b) / (tc1 - tc0), 3))
        for pid in pids
        for a, b in [(c0[pid], c1[pid])]
        if a is not None and b is not None
    )
    return (
        first,
        res,
        ProgressWindow(window_s=round(time.monotonic() - t0, 3), source="stacks", cpu_share=share),
    )


def _job_key(d: Found) -> Tuple[Any, ...]:
    """Which job a discovered process belongs to: its torchrun run id and rendezvous address;
    processes with none of these are grouped by session (one launch from a shell)."""
    e = d.get("env", {})
    key = (e.get("TORCHELASTIC_RUN_ID", ""), e.get("MASTER_ADDR", ""), e.get("MASTER_PORT", ""))
    return key if any(key) else ("session", d.get("sid"))


def _started(ds: List[Found]) -> float:
    """When a job started most recently: its newest process (a restarted rank counts)."""
    return max(d.get("start_time") or 0.0 for d in ds)


def _describe_job(ds: List[Found]) -> str:
    """``pid 12 (rank 0), pid 13 (rank 1): python train.py --lr 1 (started 20:10:03)``"""
    ds = sorted(ds, key=lambda d: (d["rank"] < 0, d["rank"], d["pid"]))
    who = ", ".join(
        "pid %d%s" % (d["pid"], " (rank %d)" % d["rank"] if d["rank"] >= 0 else "") for d in ds[:8]
    )
    if len(ds) > 8:
        who += ", ... (%d processes)" % len(ds)
    cmd = shlex.join(ds[0].get("cmdline") or ["?"])
    if len(cmd) > 120:
        cmd = cmd[:117] + "..."
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(_started(ds))) if _started(ds) else "?"
    return "%s: %s (started %s)" % (who, cmd, when)


def list_jobs() -> List[str]:
    """One line per torch.distributed job on this host, newest first: ``uid N: pid 12
    (rank 0), ...: python train.py (started ...)`` (what ``hangtrace attach --list``
    prints: the ``--pid`` values to pass on a shared machine)."""
    jobs: Dict[Tuple[Any, ...], List[Found]] = {}
    for d in find_torch_processes():
        jobs.setdefault(_job_key(d), []).append(d)
    return [
        "uid %s: %s" % (",".join(sorted({str(d.get("uid")) for d in ds})), _describe_job(ds))
        for ds in sorted(jobs.values(), key=_started, reverse=True)
    ]


def choose_job(found: List[Found], uid: int) -> Tuple[List[Found], str, List[str]]:
    """Which job ``hangtrace attach`` without ``--pid`` diagnoses: among the jobs of
    ``found`` (grouped by ``_job_key``), the one started most recently among those owned
    by ``uid`` (every process of it), else among all. Returns its processes, the line that
    says which and why, and one note per job left out."""
    jobs: Dict[Tuple[Any, ...], List[Found]] = {}
    for d in found:
        jobs.setdefault(_job_key(d), []).append(d)
    mine = [ds for ds in jobs.values() if all(d.get("uid") == uid for d in ds)]
    pool = mine or list(jobs.values())
    chosen = max(pool, key=_started)
    n, others = len(pool), len(jobs) - len(mine)
    if mine:
        why = (
            "the only torch.distributed job owned by uid %d" % uid
            if n == 1
            else "the newest of %d torch.distributed jobs owned by uid %d" % (n, uid)
        )
        if others:
            why += "; %d job%s of other users left out" % (others, "" if others == 1 else "s")
    else:
        owners = sorted({int(d["uid"]) for d in chosen if d.get("uid") is not None})
        why = "no torch.distributed job is owned by uid %d; %s (uid %s)" % (
            uid,
            "the only job found" if n == 1 else "the newest of %d jobs found" % n,
            ",".join(str(u) for u in owners) or "?",
        )
    line = "attaching to %s: %s%s" % (
        _describe_job(chosen),
        why,
        "; pass --pid to choose another" if len(jobs) > 1 else "",
    )
    notes = []
    for ds in jobs.values():
        if ds is not chosen:
            notes.append("another job left out (%s); pass --pid to choose it" % _describe_job(ds))
    return chosen, line, notes
