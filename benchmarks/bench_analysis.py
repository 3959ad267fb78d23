"""Analysis time and memory at scale, side by side with PyTorch's Flight Recorder analyzer.

One synthetic hang, written in both tools' formats:

* ``W`` ranks (default ladder 64, 256, 1024, 4096), each holding the newest ``N`` records
  (default 2000) of a longer history (the rings wrapped: the windows start mid-history);
* groups: the world group, tensor-parallel (TP) groups of 8 consecutive ranks and data-
  parallel (DP) groups of every 8th rank (``W/8`` ranks each);
* each training step issues 4 TP all_reduces, 1 DP all_reduce and 1 world all_reduce;
* rank ``C = 3W/4 + 3`` skipped the last world all_reduce (it moved on to the next step,
  outside collectives); every other rank is blocked in it.

The right verdict names rank ``C`` alone.

Measured, each in a fresh interpreter (so peak RSS is the run's own):

``hangtrace``
    builds the Snapshot in memory (``ProcessInfo`` with records as ``format.decode_slots``
    produces them), then times ``analysis.diagnose``. Reported: build time and RSS, the
    time of ``diagnose`` and its own peak RSS increase (``VmHWM`` reset through
    ``/proc/self/clear_refs`` after the build), a second ``diagnose`` after
    ``gc.freeze()`` (for information: how much of the time is the garbage collector
    walking the snapshot's millions of dicts).
``hangtrace-rings``
    (one size, default 1024 ranks) real ring files written with
    ``hooks.recorder.Recorder`` into a snapshot folder, then ``collect.load_snapshot`` +
    ``diagnose`` timed in a fresh interpreter: read + analysis, as ``hangtrace analyze
    SNAPSHOT`` does.
``flight-recorder``
    the same hang as per-rank pickled Flight Recorder dumps (NCCL-style entries:
    ``profiling_name`` 'nccl:all_reduce', states 'completed' / 'started', ``pg_config``
    with every group the rank belongs to, version '2.10'), analysed with torch's own
    ``python -m torch.distributed.flight_recorder.fr_trace DIR -p PREFIX``. Wall time and
    peak RSS come from ``os.wait4``; a run longer than ``--cap-s`` (120 s) is killed and
    larger sizes are not attempted. Its verdict is read from its log ("missing ranks:",
    "Culprit rank").
``flight-recorder-gloo``
    (smallest size only) the same dumps the way torch 2.13 writes them on gloo: empty
    ``pg_config``, ``'gloo:all_reduce'``, state 'scheduled' (checked against a real
    ``_dump_fr_trace`` on this machine).

Usage::

    python3 benchmarks/bench_analysis.py [--quick] [--out results.json]
        [--sizes 64,256,1024,4096] [--records 2000] [--rings-size 1024] [--cap-s 120]

Targets: 4,096 ranks x 2,000 records analysed in <= 5 s and <= 2 GB.
"""

import argparse
import gc
import json
import os
import pickle
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.abspath(__file__)
T0 = 1_790_000_000_000_000_000
MS = 1_000_000
HISTORY = 1000  # ops issued before the ring window starts
PATTERN = ("tp", "tp", "tp", "tp", "dp", "world")
PER_STEP = {"tp": 4, "dp": 1, "world": 1}
NUMEL = {"tp": 4096, "dp": 1 << 20, "world": 1}
TP = 8


# --------------------------------------------------------------------------- schedule
def culprit_of(world):
    return (3 * world) // 4 + 3 if world > 8 else world - 1


def horizon(nrec):
    """Total ops issued by a blocked rank (the last one, a world all_reduce, hangs)."""
    h = HISTORY + nrec
    return -(-h // len(PATTERN)) * len(PATTERN)


def op_at(pos):
    """(pos, kind, per-group seq, step) of the op a rank issues at position ``pos`` (0-based)."""
    step, j = divmod(pos, len(PATTERN))
    kind = PATTERN[j]
    within = sum(1 for k in PATTERN[:j] if k == kind)
    return (pos, kind, step * PER_STEP[kind] + within + 1, step + 1)


def schedule(nrec):
    """[(pos, kind, seq, step)] for positions H-1-nrec .. H-1 (shared by every rank)."""
    H = horizon(nrec)
    return [op_at(pos) for pos in range(H - 1 - nrec, H)]


def groups_of(world):
    """(world def, [tp defs], [dp defs]) with names as torch gives them ('0', '1', ...)."""
    ntp = world // TP
    w = {"name": "0", "desc": "default_pg", "ranks": range(world), "order": 0}
    tps = [
        {"name": str(1 + i), "desc": "tp%d" % i, "ranks": range(i * TP, (i + 1) * TP), "order": 1 + i}
        for i in range(ntp)
    ]
    dps = [
        {"name": str(1 + ntp + j), "desc": "dp%d" % j, "ranks": range(j, world, TP), "order": 1 + ntp + j}
        for j in range(TP)
    ]
    return w, tps, dps


def rank_groups(world, rank, defs):
    w, tps, dps = defs
    return {"world": w, "tp": tps[rank // TP], "dp": dps[rank % TP]}


def positions(rank, culprit, sched):
    """The window of ``rank``: the culprit never issued the last op, so its ring ends one earlier."""
    return sched[:-1] if rank == culprit else sched[1:]


# --------------------------------------------------------------------------- hangtrace side
def build_snapshot(world, nrec):
    from hangtrace.tracer.snapshot import ProcessInfo, Snapshot

    sched = schedule(nrec)
    defs = groups_of(world)
    culprit = culprit_of(world)
    H = horizon(nrec)
    shape = {k: str(v) for k, v in NUMEL.items()}
    procs = []
    for rank in range(world):
        gs = rank_groups(world, rank, defs)
        gname = {k: v["name"] for k, v in gs.items()}
        off = rank * 1000
        recs = []
        for pos, kind, seq, step in positions(rank, culprit, sched):
            t = T0 + pos * MS + off
            last = pos == H - 1
            recs.append(
                {
                    "idx": pos + 1,
                    "kind": "collective",
                    "op": "all_reduce",
                    "group": gname[kind],
                    "seq": seq,
                    "dtype": "float32",
                    "numel": NUMEL[kind],
                    "shape": shape[kind],
                    "peer": -1,
                    "async_op": False,
                    "batch": False,
                    "thread": "MainThread",
                    "phase": "train",
                    "step": step,
                    "t_mono_ns": t - T0,
                    "t_wall_ns": t,
                    "t_end_mono_ns": None if last else t - T0 + 100_000,
                    "state": "issued" if last else "completed",
                    "error": None,
                    "a": (0, 0, 0, 0, 0),
                }
            )
        lastrec = recs[-1]
        if rank == culprit:  # moved on to the next step, outside collectives
            prog, step, inflight = lastrec["t_wall_ns"] + 2_000 * MS, lastrec["step"] + 1, None
        else:
            prog, step, inflight = recs[-2]["t_wall_ns"] + 100_000, lastrec["step"], lastrec
        groups = [
            {
                "op": "new_group",
                "order": g["order"],
                "member": True,
                "name": g["name"],
                "desc": g["desc"],
                "backend": "nccl",
                "ranks": list(g["ranks"]),
            }
            for g in (gs["world"], gs["tp"], gs["dp"])
        ]
        procs.append(
            ProcessInfo(
                host="node%d" % (rank // 8),
                pid=10000 + rank % 8,
                rank=rank,
                local_rank=rank % 8,
                world_size=world,
                run_id="bench",
                state="alive",
                start_wall_ns=T0,
                phase="train",
                step=step,
                progress_wall_ns=prog,
                progress_mono_ns=prog - T0,
                inflight=inflight,
                records=recs,
                groups=groups,
            )
        )
    last = max(p.progress_wall_ns for p in procs)
    return Snapshot(
        run_dir="/tmp/bench-run", taken_wall_ns=last + 600 * 1_000_000_000, reason="stall", processes=procs
    )


def _status():
    d = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                k, v = line.split(":")
                d[k] = int(v.split()[0]) * 1024
    return d


def _reset_hwm():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _verdict(d):
    return {
        "kind": d.kind,
        "culprit_ranks": d.culprit_ranks[:20],
        "group": d.group,
        "seq": d.seq,
        "cause": d.cause,
        "summary": (d.summary or "")[:300],
    }


def _timed_diagnose(snap, out, tag):
    from hangtrace.tracer.analyze.diagnose import diagnose

    base = _status()["VmRSS"]
    hwm_ok = _reset_hwm()
    t = time.perf_counter()
    cpu = time.process_time()
    d = diagnose(snap)
    out[tag + "_s"] = time.perf_counter() - t
    out[tag + "_cpu_s"] = time.process_time() - cpu
    st = _status()
    out[tag + "_peak_increase_bytes"] = (st["VmHWM"] - base) if hwm_ok else None
    out[tag + "_retained_bytes"] = st["VmRSS"] - base
    return d


def child_hangtrace(world, nrec):
    import hangtrace.tracer.analyze.diagnose  # noqa: F401  (imports outside the measured build)

    out = {"world": world, "records": nrec}
    out["rss_after_imports"] = _status()["VmRSS"]
    t = time.perf_counter()
    snap = build_snapshot(world, nrec)
    out["build_s"] = time.perf_counter() - t
    out["rss_after_build"] = _status()["VmRSS"]
    out["snapshot_bytes"] = out["rss_after_build"] - out["rss_after_imports"]
    out["n_records"] = sum(len(p.records) for p in snap.processes)
    d = _timed_diagnose(snap, out, "diagnose")
    out["verdict"] = _verdict(d)
    gc.collect()
    gc.freeze()
    _timed_diagnose(snap, out, "diagnose_gc_frozen")
    out["peak_rss"] = _status()["VmHWM"]
    print("RESULT " + json.dumps(out))


def write_rings(world, nrec, snap_dir):
    """Real ring files (Recorder) for the synthetic hang, as a stored snapshot folder."""
    from unittest import mock
    from hangtrace.hooks.record import recorder as R
    from hangtrace.tracer.ring import layout as F

    rings = os.path.join(snap_dir, "rings")
    os.makedirs(rings, exist_ok=True)
    sched = schedule(nrec)
    defs = groups_of(world)
    culprit = culprit_of(world)
    H = horizon(nrec)
    states = {}
    host = __import__("socket").gethostname()
    op = F.OP_IDS["all_reduce"]
    dt = F.DTYPE_IDS["float32"]
    # the ring holds nrec slots; the rank issues HISTORY more ops first, so it wraps
    hist = [op_at(pos) for pos in range(0, H - 1 - nrec)]
    for rank in range(world):
        pid = 100000 + rank
        with (
            mock.patch.object(R.os, "getpid", return_value=pid),
            mock.patch.dict(
                os.environ, {"RANK": str(rank), "LOCAL_RANK": str(rank % 8), "WORLD_SIZE": str(world)}
            ),
        ):
            rec = R.Recorder(rings, "bench", nrec, lambda msg, key: None)
        gs = rank_groups(world, rank, defs)
        sid = {}
        for k in ("world", "tp", "dp"):
            g = gs[k]
            rec.group_created(
                {
                    "op": "new_group",
                    "order": g["order"],
                    "member": True,
                    "name": g["name"],
                    "desc": g["desc"],
                    "backend": "nccl",
                    "ranks": list(g["ranks"]),
                }
            )
            sid[k] = rec.intern(g["name"])
        shp = {k: rec.intern(str(v)) for k, v in NUMEL.items()}
        rec.phase_enter("train")
        # the whole history: the culprit stops before the last op, the others block in it
        mine = hist + (sched[:-1] if rank == culprit else sched)
        cur_step = None
        for pos, kind, seq, step in mine:
            if step != cur_step:
                rec._step = step
                cur_step = step
            idx = rec.issue(F.K_COLL, op, sid[kind], seq, NUMEL[kind], shp[kind], dt, -1, 0)
            if pos != H - 1:
                rec.complete(idx)
        if rank == culprit:
            rec.step(cur_step + 1)  # moved on to the next step
        rec.close()
        states["%s:%d" % (host, pid)] = {
            "state": "alive",
            "exit_code": None,
            "rank": rank,
            "stack_error": None,
        }
    with open(os.path.join(snap_dir, "processes.json"), "w") as f:
        json.dump(
            {
                "run_dir": snap_dir,
                "taken_wall_ns": time.time_ns() + 600 * 10**9,
                "reason": "stall",
                "errors": [],
                "processes": states,
            },
            f,
        )


def child_write_rings(world, nrec, snap_dir):
    t = time.perf_counter()
    write_rings(world, nrec, snap_dir)
    files = [os.path.join(snap_dir, "rings", f) for f in os.listdir(os.path.join(snap_dir, "rings"))]
    du = sum(os.stat(f).st_blocks * 512 for f in files)  # allocated (the string tables are sparse)
    print("RESULT " + json.dumps({"write_s": time.perf_counter() - t, "disk_bytes": du}))


def child_read_rings(snap_dir):
    from hangtrace.tracer.analyze.diagnose import diagnose
    from hangtrace.tracer.collect.rings import load_snapshot

    out = {"rss_after_imports": _status()["VmRSS"]}
    t = time.perf_counter()
    snap = load_snapshot(snap_dir)
    out["read_s"] = time.perf_counter() - t
    out["rss_after_read"] = _status()["VmRSS"]
    out["n_processes"] = len(snap.processes)
    out["n_records"] = sum(len(p.records) for p in snap.processes)
    out["read_errors"] = snap.errors[:5]
    base = out["rss_after_read"]
    _reset_hwm()
    t2 = time.perf_counter()
    d = diagnose(snap)
    out["diagnose_s"] = time.perf_counter() - t2
    out["read_plus_diagnose_s"] = time.perf_counter() - t
    out["diagnose_peak_increase_bytes"] = _status()["VmHWM"] - base
    out["verdict"] = _verdict(d)
    print("RESULT " + json.dumps(out))


# --------------------------------------------------------------------------- Flight Recorder side
FR_PREFIX = "nccl_trace_rank_"
FR_FRAMES = [
    {"name": "all_reduce", "filename": "/site-packages/torch/distributed/distributed_c10d.py", "line": 3245},
    {"name": "train_step", "filename": "/job/train.py", "line": 40},
    {"name": "main", "filename": "/job/train.py", "line": 90},
]


def write_fr(world, nrec, out_dir, gloo=False):
    """Per-rank FR dumps of the synthetic hang (pickles, as ``_dump_fr_trace`` writes them)."""
    os.makedirs(out_dir, exist_ok=True)
    sched = schedule(nrec)
    defs = groups_of(world)
    culprit = culprit_of(world)
    H = horizon(nrec)
    pgid = {}
    pgid["0"] = 0
    backend = "gloo" if gloo else "nccl"
    for rank in range(world):
        gs = rank_groups(world, rank, defs)
        ents = []
        for pos, kind, seq, step in positions(rank, culprit, sched):
            g = gs[kind]
            t = T0 + pos * MS + rank * 1000
            last = pos == H - 1
            n = NUMEL[kind]
            ents.append(
                {
                    "frames": FR_FRAMES,
                    "record_id": pos,
                    "pg_id": int(g["name"]),
                    "process_group": (g["name"], g["desc"]),
                    "thread_name": "python",
                    "thread_id": "140508765096832",
                    "collective_seq_id": seq,
                    "p2p_seq_id": 0,
                    "op_id": seq,
                    "profiling_name": "%s:all_reduce" % backend,
                    "time_created_ns": t,
                    "input_sizes": [[n]],
                    "input_dtypes": ["Float"],
                    "output_sizes": [[n]],
                    "output_dtypes": ["Float"],
                    "state": "scheduled" if gloo else ("started" if last else "completed"),
                    "time_discovered_started_ns": None if gloo else t + 1000,
                    "time_discovered_completed_ns": None if (gloo or last) else t + 100_000,
                    "retired": gloo or not last,
                    "timeout_ms": 600000,
                    "is_p2p": False,
                }
            )
        if gloo:
            pg_config = {"": {"name": "", "desc": "", "ranks": "[]"}}
        else:
            pg_config = {
                g["name"]: {"name": g["name"], "desc": g["desc"], "ranks": str(list(g["ranks"]))}
                for g in (gs["world"], gs["tp"], gs["dp"])
            }
        pg_status = {}
        for k in ("world", "tp", "dp"):
            last_seq = max(e["collective_seq_id"] for e in ents if e["process_group"][0] == gs[k]["name"])
            hung = k == "world" and rank != culprit
            pg_status[gs[k]["name"]] = {
                "last_enqueued_collective": last_seq,
                "last_started_collective": last_seq,
                "last_completed_collective": last_seq - 1 if hung else last_seq,
            }
        dump = {
            "version": "2.10",
            "pg_config": pg_config,
            "comm_lib_version": "2.21.5",
            "pg_status": pg_status,
            "entries": ents,
        }
        with open(os.path.join(out_dir, "%s%d" % (FR_PREFIX, rank)), "wb") as f:
            pickle.dump(dump, f, protocol=pickle.HIGHEST_PROTOCOL)


def child_write_fr(world, nrec, out_dir, gloo):
    t = time.perf_counter()
    write_fr(world, nrec, out_dir, gloo)
    print("RESULT " + json.dumps({"write_s": time.perf_counter() - t}))


def parse_fr_log(text, world):
    """FR's verdict from its log: the 'missing ranks' / 'Culprit rank' of its first finding."""
    missing = re.findall(r"missing ranks: \{([^}]*)\}", text)
    culprits = re.findall(r"Culprit rank (\d+)", text)
    first = None
    if missing:
        first = sorted(int(x) for x in missing[0].split(",") if x.strip())
    elif culprits:
        first = sorted(set(int(x) for x in culprits))
    m = re.search(
        r"(Not all ranks joining collective|Collective sequence number: \d+ has errors"
        r"|Input/output mismatch)[^\n]*",
        text,
    )
    grp = re.search(r"group info: ([^\n]*)", text)
    return {
        "first_finding": m.group(0) if m else None,
        "group": grp.group(1) if grp else None,
        "blamed_ranks": first,
        "n_missing_reports": len(missing),
        "n_culprit_lines": len(culprits),
    }


# --------------------------------------------------------------------------- parent
def run_child(argv, cap_s, env=None):
    """Run a child; return (rc or None if killed at the cap, wall s, peak RSS bytes, stdout, stderr)."""
    t = time.perf_counter()
    with tempfile.TemporaryFile() as fo, tempfile.TemporaryFile() as fe:
        p = subprocess.Popen(argv, stdout=fo, stderr=fe, env=env, start_new_session=True)
        killed = False
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if cap_s and time.perf_counter() - t > cap_s:
                os.killpg(p.pid, signal.SIGKILL)
                pid, status, ru = os.wait4(p.pid, 0)
                killed = True
                break
            time.sleep(0.05)
        wall = time.perf_counter() - t
        p.returncode = os.waitstatus_to_exitcode(status)
        fo.seek(0)
        fe.seek(0)
        out = fo.read().decode(errors="replace")
        err = fe.read().decode(errors="replace")
    return (None if killed else p.returncode), wall, ru.ru_maxrss * 1024, out, err


def _result(out):
    for line in out.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return None


def _mem_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def _gb(b):
    return "—" if b is None else "%.2f GB" % (b / 1e9) if b >= 1e9 else "%.0f MB" % (b / 1e6)


def _s(x):
    return "—" if x is None else "%.2f s" % x


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="sizes 64,256; 1000 records; rings at 256")
    ap.add_argument("--sizes", default=None, help="comma-separated rank counts (default 64,256,1024,4096)")
    ap.add_argument("--records", type=int, default=None, help="records per rank (default 2000)")
    ap.add_argument("--rings-size", type=int, default=None, help="ranks for the ring-file run (default 1024)")
    ap.add_argument("--cap-s", type=float, default=120.0, help="time cap per Flight Recorder run")
    ap.add_argument("--no-fr", action="store_true", help="skip the Flight Recorder runs")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ap.add_argument("--tmp", default=None, help="scratch directory (default a new temp dir)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--dir", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--gloo", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    nrec = a.records or (1000 if a.quick else 2000)
    if a.child == "hangtrace":
        return child_hangtrace(a.world, nrec)
    if a.child == "write-rings":
        return child_write_rings(a.world, nrec, a.dir)
    if a.child == "read-rings":
        return child_read_rings(a.dir)
    if a.child == "write-fr":
        return child_write_fr(a.world, nrec, a.dir, a.gloo)

    sizes = (
        [int(x) for x in a.sizes.split(",")] if a.sizes else ([64, 256] if a.quick else [64, 256, 1024, 4096])
    )
    rings_size = a.rings_size or (256 if a.quick else 1024)
    tmp = a.tmp or tempfile.mkdtemp(prefix="bench_analysis_")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HANGTRACE")}
    py = [sys.executable, HERE, "--records", str(nrec)]
    res = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_start": os.getloadavg(),
        },
        "records_per_rank": nrec,
        "sizes": sizes,
        "hangtrace": [],
        "flight_recorder": [],
        "problems": [],
    }
    try:  # no `import torch` here: a forked child's ru_maxrss starts at the parent's RSS
        from importlib.metadata import version

        res["machine"]["torch"] = version("torch")
    except Exception:
        pass
    fr_stop = a.no_fr
    if not a.no_fr:  # what the FR analyzer costs before it reads anything (imports torch)
        rc, wall, rss, out, err = run_child(
            [sys.executable, "-c", "import torch.distributed.flight_recorder.fr_trace"], 0, env
        )
        res["fr_import_baseline"] = {"wall_s": wall, "peak_rss": rss}
    try:
        for w in sizes:
            c = culprit_of(w)
            # hangtrace: build + diagnose in memory
            need = w * nrec * 1400
            if _mem_available() < need * 1.2:
                res["problems"].append(
                    "hangtrace %d ranks: skipped, needs ~%s, %s available"
                    % (w, _gb(need), _gb(_mem_available()))
                )
            else:
                rc, wall, rss, out, err = run_child(py + ["--child", "hangtrace", "--world", str(w)], 0, env)
                r = _result(out) or {"error": err[-2000:]}
                r.update(world=w, expected_culprit=c, rc=rc, wall_s=wall, peak_rss=rss)
                if rc != 0:
                    res["problems"].append("hangtrace child %d ranks failed: %s" % (w, err[-500:]))
                elif r["verdict"]["culprit_ranks"] != [c]:
                    res["problems"].append(
                        "hangtrace %d ranks: blamed %s, expected [%d] (%s)"
                        % (w, r["verdict"]["culprit_ranks"], c, r["verdict"]["kind"])
                    )
                res["hangtrace"].append(r)
                print(
                    "hangtrace %5d ranks: build %.1f s (%s), diagnose %.2f s (+%s peak), verdict %s %s"
                    % (
                        w,
                        r.get("build_s", 0),
                        _gb(r.get("snapshot_bytes")),
                        r.get("diagnose_s", 0),
                        _gb(r.get("diagnose_peak_increase_bytes")),
                        r.get("verdict", {}).get("kind"),
                        r.get("verdict", {}).get("culprit_ranks"),
                    ),
                    file=sys.stderr,
                    flush=True,
                )
            # Flight Recorder
            variants = [("nccl", False)] + ([("gloo", True)] if w == sizes[0] else [])
            for name, gloo in variants:
                if fr_stop and not gloo:
                    res["flight_recorder"].append(
                        {
                            "world": w,
                            "format": name,
                            "ran": False,
                            "note": "not attempted (a smaller size hit the cap)"
                            if not a.no_fr
                            else "--no-fr",
                        }
                    )
                    continue
                if a.no_fr:
                    continue
                d = os.path.join(tmp, "fr-%s-%d" % (name, w))
                rc, wall, rss, out, err = run_child(
                    py
                    + ["--child", "write-fr", "--world", str(w), "--dir", d]
                    + (["--gloo"] if gloo else []),
                    0,
                    env,
                )
                wr = _result(out) or {}
                rc, wall, rss, out, err = run_child(
                    [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", d, "-p", FR_PREFIX],
                    a.cap_s,
                    env,
                )
                log = out + err
                r = {
                    "world": w,
                    "format": name,
                    "write_s": wr.get("write_s"),
                    "rc": rc,
                    "wall_s": wall,
                    "peak_rss": rss,
                    "ran": rc == 0,
                    "timed_out": rc is None,
                    "expected_culprit": c,
                }
                r.update(parse_fr_log(log, w))
                if rc not in (0, None):
                    tb = [ln for ln in log.strip().splitlines() if ln.strip()]
                    r["error"] = tb[-1][:300] if tb else "exit %s" % rc
                res["flight_recorder"].append(r)
                print(
                    "flight-recorder(%s) %5d ranks: rc=%s %.1f s %s blamed %s%s"
                    % (
                        name,
                        w,
                        rc,
                        wall,
                        _gb(rss),
                        r["blamed_ranks"],
                        " (%s)" % r.get("error") if r.get("error") else "",
                    ),
                    file=sys.stderr,
                    flush=True,
                )
                if rc is None and not gloo:
                    fr_stop = True
                shutil.rmtree(d, ignore_errors=True)
        # read + analysis from real ring files
        d = os.path.join(tmp, "rings-%d" % rings_size)
        rc, wall, rss, out, err = run_child(
            py + ["--child", "write-rings", "--world", str(rings_size), "--dir", d], 0, env
        )
        wr = _result(out) or {"error": err[-1000:]}
        rc, wall, rss, out, err = run_child(py + ["--child", "read-rings", "--dir", d], 0, env)
        r = _result(out) or {"error": err[-2000:]}
        r.update(
            world=rings_size,
            expected_culprit=culprit_of(rings_size),
            rc=rc,
            wall_s=wall,
            peak_rss=rss,
            write_s=wr.get("write_s"),
            ring_bytes=wr.get("disk_bytes"),
        )
        if rc != 0:
            res["problems"].append("ring read child failed: %s" % err[-500:])
        elif r["verdict"]["culprit_ranks"] != [culprit_of(rings_size)]:
            res["problems"].append(
                "rings %d ranks: blamed %s, expected [%d]"
                % (rings_size, r["verdict"]["culprit_ranks"], culprit_of(rings_size))
            )
        res["hangtrace_rings"] = r
        shutil.rmtree(d, ignore_errors=True)
    finally:
        if not a.tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    res["machine"]["loadavg_end"] = os.getloadavg()
    print_tables(res)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=2)
    return 1 if res["problems"] else 0


def print_tables(res):
    print(
        "\n### hangtrace: synthetic snapshot, %d records per rank (fresh interpreter per size)\n"
        % res["records_per_rank"]
    )
    print(
        "| ranks | records | build | snapshot in memory | diagnose | diagnose (gc frozen) | "
        "diagnose peak increase | process peak RSS | verdict | culprit (expected) |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
    for r in res["hangtrace"]:
        v = r.get("verdict") or {}
        print(
            "| %d | %s | %s | %s | **%s** | %s | **%s** | %s | %s | %s (%d) |"
            % (
                r["world"],
                "{:,}".format(r.get("n_records", 0)),
                _s(r.get("build_s")),
                _gb(r.get("snapshot_bytes")),
                _s(r.get("diagnose_s")),
                _s(r.get("diagnose_gc_frozen_s")),
                _gb(r.get("diagnose_peak_increase_bytes")),
                _gb(r.get("peak_rss")),
                v.get("kind"),
                v.get("culprit_ranks"),
                r["expected_culprit"],
            )
        )
    rr = res.get("hangtrace_rings")
    if rr:
        v = rr.get("verdict") or {}
        print(
            "\n### hangtrace: read real ring files + diagnose (`load_snapshot` + `diagnose`), %d ranks\n"
            % rr["world"]
        )
        print(
            "| ranks | records | ring files on disk | read | diagnose | read + diagnose | process peak RSS | verdict | "
            "culprit (expected) |"
        )
        print("|---:|---:|---:|---:|---:|---:|---:|---|---|")
        print(
            "| %d | %s | %s | %s | %s | **%s** | %s | %s | %s (%d) |"
            % (
                rr["world"],
                "{:,}".format(rr.get("n_records", 0)),
                _gb(rr.get("ring_bytes")),
                _s(rr.get("read_s")),
                _s(rr.get("diagnose_s")),
                _s(rr.get("read_plus_diagnose_s")),
                _gb(rr.get("peak_rss")),
                v.get("kind"),
                v.get("culprit_ranks"),
                rr["expected_culprit"],
            )
        )
    if res["flight_recorder"]:
        print(
            "\n### PyTorch Flight Recorder analyzer (`python -m torch.distributed.flight_recorder.fr_trace`), "
            "same hang, same sizes\n"
        )
        b = res.get("fr_import_baseline") or {}
        print(
            "Importing the analyzer alone (`import torch.distributed.flight_recorder.fr_trace`) takes %s and "
            "%s peak RSS; it is included below.\n" % (_s(b.get("wall_s")), _gb(b.get("peak_rss")))
        )
        print(
            "| ranks | dump format | ran | wall (incl. reading pickles) | peak RSS | first finding | "
            "blamed | expected |"
        )
        print("|---:|---|---|---:|---:|---|---|---:|")
        for r in res["flight_recorder"]:
            if not r.get("ran") and r.get("note"):
                print(
                    "| %d | %s | %s | — | — | — | — | %d |"
                    % (r["world"], r["format"], r["note"], culprit_of(r["world"]))
                )
                continue
            ran = (
                "yes" if r["ran"] else ("killed at cap" if r["timed_out"] else "crashed: %s" % r.get("error"))
            )
            print(
                "| %d | %s | %s | %s | %s | %s | %s | %d |"
                % (
                    r["world"],
                    r["format"],
                    ran,
                    _s(r["wall_s"]),
                    _gb(r["peak_rss"]),
                    (r.get("first_finding") or "—")[:60],
                    r.get("blamed_ranks"),
                    r["expected_culprit"],
                )
            )
    if res["problems"]:
        print("\nPROBLEMS:")
        for p in res["problems"]:
            print("- " + p)


if __name__ == "__main__":
    sys.exit(main())
