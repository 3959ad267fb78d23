"""``hangtrace attach``: diagnose a hung job that was not started with hangtrace.

There are no flight records, only what can be seen from outside: the processes'
initial environment (rank, local rank, world size from ``/proc/PID/environ``) and
py-spy stacks of every rank, taken in parallel. The analysis is the same pure
``diagnose()`` on a Snapshot whose processes have stacks and no records; it merges the
stacks (STAT-style prefix tree) and names the outliers in the same vocabulary.
:func:`collect` gathers and stores; :func:`stack_verdict` is the stack-only verdict (pure);
``tracer.pipeline.attach`` composes them.
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


def stack_verdict(snap):
    """Diagnosis from stacks alone (no flight records): pure function of the snapshot.

    Each rank's analysed thread is classified as *in a collective* (a torch.distributed
    collective/p2p frame on its stack, which op) or *outside* (blocked in a queue, lock,
    sleep, IO ... or simply not in torch.distributed). Then:
    ranks outside while others wait in collectives -> ``stuck-outside-collective``;
    all in collectives but in different ops or call paths -> ``collective-mismatch``
    naming the minority; missing ranks (world size larger than the ranks found) ->
    named in the evidence; otherwise ``unknown`` (all ranks in the same collective:
    the transport, or a rank outside this host).
    """
    from hangtrace.tracer.diagnosis import Diagnosis
    from hangtrace.tracer.analyze.stacktree import (blocking_reason, classes, collective_frame, format_ranks, merge_stacks,
                            process_frames)
    procs = [p for p in snap.processes if p.rank >= 0]
    tree = merge_stacks(procs)
    cls = classes(tree)
    inside, outside, nostack = {}, {}, []
    frames_of = {}
    for p in procs:
        frames, thread = process_frames(p)
        if not frames:
            nostack.append(p.rank)
            continue
        frames_of[p.rank] = frames
        cf = collective_frame(frames)
        if cf:
            inside[p.rank] = cf.split(" ")[0]
        else:
            outside[p.rank] = blocking_reason(frames, thread.get("active") if thread else None) or \
                "not in torch.distributed"
    d = Diagnosis(kind="unknown", stack_classes=cls, errors=list(snap.errors))
    d.details["source"] = "stacks only (hangtrace attach: no flight records)"
    ev = d.evidence
    for c in cls:
        ev.append("ranks %s: %s" % (format_ranks(c["ranks"]), " > ".join(c["frames"][-4:])))
    world = max([p.world_size for p in procs if p.world_size and p.world_size <= _MAX_WORLD] or [-1])
    have = {p.rank for p in procs}
    missing = []
    for r in range(world if world > 0 else 0):  # bounded: world <= _MAX_WORLD, <= 65536 listed
        if r not in have:
            missing.append(r)
            if len(missing) >= 65536:
                break
    if missing:
        ev.append("ranks %s of world size %d were not found on this host (dead, or on another node)"
                  % (format_ranks(missing), world))
    if nostack:
        ev.append("ranks %s: no stack (see errors)" % format_ranks(nostack))

    def top(rank):
        return ["%s (%s:%s)" % (f.get("name"), os.path.basename(f.get("filename") or ""), f.get("line"))
                for f in frames_of.get(rank, [])[:8]]

    if inside and outside:
        d.kind = "stuck-outside-collective"
        d.culprit_ranks = sorted(outside)
        d.waiting_ranks = sorted(inside)
        first = d.culprit_ranks[0]
        d.frames = top(first)
        ops = sorted(set(inside.values()))
        d.op = ops[0] if len(ops) == 1 else None
        d.summary = ("Stuck outside collectives: rank%s %s %s not in any torch.distributed call (%s) while "
                     "rank%s %s wait in %s. Its stack: %s. Next: find what it waits for outside "
                     "torch.distributed (the producer of its queue, the holder of its lock, its IO)."
                     % ("s" if len(outside) > 1 else "", format_ranks(outside), "are" if len(outside) > 1 else "is",
                        outside[first], "s" if len(inside) > 1 else "", format_ranks(inside), "/".join(ops),
                        " < ".join(d.frames[:4])))
    elif inside and len(set(inside.values())) > 1:
        by_op = {}
        for r, op in inside.items():
            by_op.setdefault(op, []).append(r)
        ranked = sorted(by_op.items(), key=lambda kv: len(kv[1]))
        if len(ranked[0][1]) < len(ranked[-1][1]):
            d.culprit_ranks = sorted(ranked[0][1])
        else:
            d.culprit_ranks = sorted(inside)
        d.kind = "collective-mismatch"
        d.details["signatures"] = [{"op": op, "dtype": None, "numel": None, "ranks": sorted(rs)}
                                   for op, rs in ranked]
        d.waiting_ranks = sorted(set(inside) - set(d.culprit_ranks))
        d.frames = top(d.culprit_ranks[0])
        d.summary = ("Collective mismatch: ranks are blocked in different collectives (%s). The odd one%s: "
                     "rank%s %s. Its stack: %s. Next: compare the code paths; a rank took a different branch."
                     % ("; ".join("%s: ranks %s" % (op, format_ranks(rs)) for op, rs in ranked),
                        "s" if len(d.culprit_ranks) > 1 else "", "s" if len(d.culprit_ranks) > 1 else "",
                        format_ranks(d.culprit_ranks), " < ".join(d.frames[:4])))
    elif inside and missing:
        d.kind = "unknown"
        d.culprit_ranks = missing
        d.waiting_ranks = sorted(inside)
        d.summary = ("Ranks %s wait in %s; ranks %s were not found on this host: they died or run on another "
                     "node. Next: attach on the other nodes, or check those ranks' logs for a crash."
                     % (format_ranks(inside), "/".join(sorted(set(inside.values()))), format_ranks(missing)))
    elif inside:
        d.waiting_ranks = sorted(inside)
        d.summary = ("Unknown: every rank found waits in the same collective (%s) with the same stack; stacks "
                     "alone cannot tell who is late. Next: run the job with HANGTRACE=1 for sequence numbers, "
                     "or check the transport (NCCL/gloo logs)." % "/".join(sorted(set(inside.values()))))
    else:
        d.summary = ("Unknown: no rank is inside a torch.distributed collective%s. Next: look at the stack "
                     "classes below; the job may be busy, not hung." % (
                         " (ranks %s have no stack)" % format_ranks(nostack) if nostack else ""))
    return d
