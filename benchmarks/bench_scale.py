"""Scale: ``hangtrace analyze --json RUN_DIR`` on 4,096 ranks x ~2,000 records each.

Writes real ring files into a temporary run directory: two template rings are recorded
with the real ``Recorder`` (the world group's definition, 2,000 records of all_reduce on
the world group with steps in between; template A ends blocked in one more all_reduce,
template B - the rank behind - stopped after its last completed one and went on with a
few steps), then copied once per rank with the header patched (pid, rank, world size,
host ``bench-node-<n>``: a host other than this one, so every process is 'unknown', as
seen from a login node). One rank (``--culprit``) gets template B.

Each code version runs ``python -m hangtrace analyze --json RUN_DIR`` in its own
subprocess, interleaved over ``--repeats`` rounds; wall time (median) and peak RSS
and CPU time (``resource.getrusage(RUSAGE_CHILDREN)`` in a fresh helper process per run) are reported side by side with the
verdict's kind and culprits. CPU time is the figure to compare on a loaded machine. ``--prev DIR`` is a checkout of the previous code (e.g.
``git worktree add /tmp/prev <commit>``); its run gets ``PYTHONPATH=DIR``.

    python benchmarks/bench_scale.py --prev /tmp/prev [--ranks 4096] [--records 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)

from hangtrace.hooks.record.recorder import Recorder  # noqa: E402
from hangtrace.tracer.ring import layout as F  # noqa: E402
from hangtrace.tracer.ring import reader as R  # noqa: E402


def _log(msg: str, key: Any = None) -> None:
    pass


def template(tmp: str, world: int, records: int, behind: bool) -> bytes:
    """Bytes of a compact ring (header, slots, used string table) recorded by the real
    Recorder: ``records`` records on the world group '0', then (A) one all_reduce left
    issued, or (B, ``behind``) three step records and no further collective."""
    d = tempfile.mkdtemp(dir=tmp)
    rec = Recorder(d, "bench-scale", 2048, _log)
    try:
        rec.set_rank(0, 0, world)
        rec.group_created(
            {
                "op": "init_process_group",
                "name": "0",
                "desc": "default_pg",
                "backend": "gloo",
                "ranks": list(range(world)),
                "order": 0,
                "member": True,
            }
        )
        g, shape = rec.intern("0"), rec.intern("1024")
        rec.phase_enter("train", step=0)
        seq = 0
        n = 2
        while n < records:
            if seq % 10 == 9:
                rec.step(seq // 10 + 1)
                n += 1
            seq += 1
            i = rec.issue(
                F.K_COLL, F.OP_IDS["all_reduce"], g, seq, 1024, shape, F.DTYPE_IDS["float32"], -1, 0
            )
            rec.complete(i)
            n += 1
        if behind:
            for k in range(3):
                rec.step(seq // 10 + 2 + k)
        else:
            rec.issue(
                F.K_COLL, F.OP_IDS["all_reduce"], g, seq + 1, 1024, shape, F.DTYPE_IDS["float32"], -1, 0
            )
        path = rec.path
    finally:
        rec.close()
    out = os.path.join(d, "compact.htr")
    R.compact_copy(path, out)
    with open(out, "rb") as f:
        return f.read()


def write_run(run_dir: str, world: int, records: int, culprit: int) -> Tuple[int, float]:
    """Write ``world`` ring files into ``run_dir``; returns (total bytes, seconds)."""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        a = template(tmp, world, records, behind=False)
        b = template(tmp, world, records, behind=True)
    total = 0
    for rank in range(world):
        buf = bytearray(b if rank == culprit else a)
        pid = 100000 + rank
        host = "bench-node-%d" % (rank // 8)
        _pid, ppid, wall, mono, _ticks = F.IDENT.unpack_from(buf, F.IDENT_OFF)
        F.IDENT.pack_into(buf, F.IDENT_OFF, pid, ppid, wall, mono, 0)
        buf[F.HOST_OFF : F.HOST_OFF + F.HOST_LEN] = host.encode().ljust(F.HOST_LEN, b"\0")
        F.RANK.pack_into(buf, F.RANK_OFF, rank, rank % 8, world, 0)
        with open(os.path.join(run_dir, "ring-%s-%d.htr" % (host, pid)), "wb") as f:
            f.write(buf)
        total += len(buf)
    return total, time.perf_counter() - t0


def run_analyze(code_dir: str, run_dir: str, timeout_s: float) -> Dict[str, Any]:
    """``python -m hangtrace analyze --json RUN_DIR`` with ``PYTHONPATH=code_dir``:
    {'wall_s', 'maxrss_mib', 'rc', 'kind', 'culprits'} (wall/RSS of that child alone)."""
    env = dict(os.environ, PYTHONPATH=code_dir)
    env.pop("HANGTRACE", None)
    t0 = time.perf_counter()
    p = subprocess.Popen(
        [sys.executable, "-m", "hangtrace", "analyze", "--json", run_dir],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd="/",
    )
    try:
        out, err = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        return {"wall_s": None, "maxrss_mib": None, "rc": "timeout", "kind": None, "culprits": None}
    wall = time.perf_counter() - t0
    # the child is reaped by communicate(); RUSAGE_CHILDREN sums/maximises over every child
    # so far, so each run is measured in a fresh helper process (see _measure)
    try:
        d = json.loads(out)
        kind, culprits = d.get("kind"), d.get("culprit_ranks")
    except ValueError:
        kind, culprits = None, None
    return {
        "wall_s": wall,
        "rc": p.returncode,
        "kind": kind,
        "culprits": culprits,
        "stderr": err.decode("utf-8", "replace")[-300:] if p.returncode else "",
    }


def _measure(code_dir: str, run_dir: str, timeout_s: float) -> Dict[str, Any]:
    """One measurement in a fresh helper process, so ``RUSAGE_CHILDREN.ru_maxrss`` is the
    peak RSS of that one analyze run."""
    code = (
        "import json, resource, sys; sys.path.insert(0, %r); import bench_scale as B; "
        "r = B.run_analyze(%r, %r, %r); "
        "u = resource.getrusage(resource.RUSAGE_CHILDREN); "
        "r['maxrss_mib'] = u.ru_maxrss / 1024; r['cpu_s'] = u.ru_utime + u.ru_stime; "
        "print(json.dumps(r))" % (os.path.dirname(os.path.abspath(__file__)), code_dir, run_dir, timeout_s)
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=HERE)
    )
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"wall_s": None, "maxrss_mib": None, "rc": "helper failed: %s" % out.stderr[-300:]}


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=4096)
    ap.add_argument("--records", type=int, default=2000)
    ap.add_argument("--culprit", type=int, default=1234)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prev", default=None, help="checkout of the previous code (PYTHONPATH for its run)")
    ap.add_argument("--prev-repeats", type=int, default=1, help="runs of the previous code (slow)")
    ap.add_argument("--timeout-s", type=float, default=900.0)
    ap.add_argument("--dir", default=None, help="run directory to write (default: a temp dir, removed)")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    a = ap.parse_args(argv)
    culprit = min(a.culprit, a.ranks - 1)
    run_dir = a.dir or tempfile.mkdtemp(prefix="hangtrace-bench-scale-")
    os.makedirs(run_dir, exist_ok=True)
    try:
        nbytes, took = write_run(run_dir, a.ranks, a.records, culprit)
        print(
            "wrote %d rings (%.0f MiB, %d records each) in %.1f s; culprit rank %d"
            % (a.ranks, nbytes / 2**20, a.records, took, culprit),
            file=sys.stderr,
        )
        versions = [("this", HERE, a.repeats)] + ([("previous", a.prev, a.prev_repeats)] if a.prev else [])
        res: Dict[str, List[Dict[str, Any]]] = {name: [] for name, _, _ in versions}
        for i in range(max(n for _, _, n in versions)):
            for name, d, n in versions:
                if i < n:
                    r = _measure(d, run_dir, a.timeout_s)
                    print(
                        "%s round %d: %s" % (name, i, {k: v for k, v in r.items() if k != "stderr"}),
                        file=sys.stderr,
                    )
                    res[name].append(r)
        print(
            "| code | ranks x records | wall s (median) | CPU s (median) | peak RSS MiB | verdict | culprits |"
        )
        print("|---|---|---|---|---|---|---|")
        for name, runs in res.items():
            ok = [r for r in runs if r.get("wall_s") is not None and r.get("rc") == 0]
            wall = "%.2f" % statistics.median(r["wall_s"] for r in ok) if ok else str(runs[0].get("rc"))
            rss = "%.0f" % max(r["maxrss_mib"] for r in ok) if ok else "-"
            cpu = "%.2f" % statistics.median(r["cpu_s"] for r in ok) if ok else "-"
            v = ok[0] if ok else {}
            print(
                "| %s | %d x %d | %s | %s | %s | %s | %s |"
                % (name, a.ranks, a.records, wall, cpu, rss, v.get("kind"), v.get("culprits"))
            )
        if a.out:
            with open(a.out, "w") as f:
                json.dump({"ranks": a.ranks, "records": a.records, "results": res}, f, indent=2)
    finally:
        if not a.dir:
            shutil.rmtree(run_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
