"""The straggler pass (issue 43, ``analyze/straggler``) at scale: its cost and its share of
the analysis, on 4,096 real ring files of about 2,000 records each.

Rings: :func:`template` (the real ``Recorder``: all_reduces on the world group '0', a step
every 10, the last one left issued), copied once per rank with the header patched (pid,
host ``bench-node-<rank // 8>``, rank, world size), and each collective's issue time (wall clock) shifted by a
per-rank, per-record jitter of 0-2 ms; rank ``--slow`` issues 30 ms later in its newest 300
collectives (so the pass does all its work: detection, change point, phase). Then, in this
process: ``collect.rings.load_run`` (the compact summaries), ``diagnose`` (the whole analysis,
the straggler pass included) and the straggler pass alone (``analyze.straggler.of_processes``),
each timed ``--repeats`` times (median of CPU time, ``time.process_time``: the figure to
compare on a shared machine) without Python's cyclic garbage collector, as ``hangtrace
analyze`` runs; peak RSS of the process.

    PYTHONPATH=. python benchmarks/bench_straggler.py [--ranks 4096] [--records 2000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import resource
import shutil
import statistics
import struct
import sys
import tempfile
import time
from typing import List, Optional

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from hangtrace.hooks.record.recorder import Recorder  # noqa: E402
from hangtrace.tracer.ring import layout as F  # noqa: E402
from hangtrace.tracer.ring import reader as R  # noqa: E402

_Q = struct.Struct("<Q")


def template(tmp: str, world: int, records: int) -> bytes:
    """Bytes of a compact ring (header, slots, used string table) recorded by the real
    Recorder in a scratch directory under ``tmp``: phase 'train' entered, then ``records``
    records on the world group '0' of ``world`` ranks (all_reduces of 1,024 floats, issued and
    completed, a step record every 10), then one all_reduce left issued. (bench_scale's own
    template became a real traced DDP job in 230c843; this synthetic ring stays here so the
    straggler pass has one collective stream to judge.)"""
    d = tempfile.mkdtemp(dir=tmp)
    rec = Recorder(d, "bench-straggler", 2048, lambda *_: None)
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
        f32, op = F.DTYPE_IDS["float32"], F.OP_IDS["all_reduce"]
        rec.phase_enter("train", step=0)
        seq, n = 0, 2
        while n < records:
            if seq % 10 == 9:
                rec.step(seq // 10 + 1)
                n += 1
            seq += 1
            rec.complete(rec.issue(F.K_COLL, op, g, seq, 1024, shape, f32, -1, 0))
            n += 1
        rec.issue(F.K_COLL, op, g, seq + 1, 1024, shape, f32, -1, 0)
        path = rec.path
    finally:
        rec.close()
    out = os.path.join(d, "compact.htr")
    R.compact_copy(path, out)
    with open(out, "rb") as f:
        return f.read()


def shifted(buf: bytearray, rank: int, slow: bool, rng: random.Random) -> None:
    """Shift the wall issue time of every collective slot of ring ``buf`` in place: 0-2 ms of
    jitter, +30 ms for the newest 300 collectives when ``slow`` (the change inside the
    summary's history of 512 records). Step numbers follow."""
    nslots = F.HDR_FIXED.unpack_from(buf, 0)[4]
    colls = [
        i
        for i in range(nslots)
        if buf[F.HEADER_SIZE + i * F.SLOT_SIZE + 8] == F.K_COLL
        and _Q.unpack_from(buf, F.HEADER_SIZE + i * F.SLOT_SIZE)[0]
    ]
    colls.sort(key=lambda i: _Q.unpack_from(buf, F.HEADER_SIZE + i * F.SLOT_SIZE)[0])
    for n, i in enumerate(colls):
        off = F.HEADER_SIZE + i * F.SLOT_SIZE + 64
        extra = rng.randint(0, 2_000_000) + (30_000_000 if slow and n > len(colls) - 300 else 0)
        _Q.pack_into(buf, off, _Q.unpack_from(buf, off)[0] + extra)


def write_run(run_dir: str, world: int, records: int, slow: int) -> float:
    """``world`` ring files in ``run_dir`` (module docstring); returns seconds taken."""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        a = template(tmp, world, records)
    rng = random.Random(0)
    for rank in range(world):
        buf = bytearray(a)
        pid = 100000 + rank
        host = "bench-node-%d" % (rank // 8)
        _pid, ppid, wall, mono, _ticks = F.IDENT.unpack_from(buf, F.IDENT_OFF)
        F.IDENT.pack_into(buf, F.IDENT_OFF, pid, ppid, wall, mono, 0)
        buf[F.HOST_OFF : F.HOST_OFF + F.HOST_LEN] = host.encode().ljust(F.HOST_LEN, b"\0")
        F.RANK.pack_into(buf, F.RANK_OFF, rank, rank % 8, world, 0)
        shifted(buf, rank, rank == slow, rng)
        with open(os.path.join(run_dir, "ring-%s-%d.htr" % (host, pid)), "wb") as f:
            f.write(buf)
    return time.perf_counter() - t0


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=4096)
    ap.add_argument("--records", type=int, default=2000)
    ap.add_argument("--slow", type=int, default=1234)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default=None, help="run directory to write (default: a temp dir, removed)")
    a = ap.parse_args(argv)
    from hangtrace.tracer.analyze.diagnose import diagnose
    from hangtrace.tracer.analyze.straggler import of_processes
    from hangtrace.tracer.collect.rings import load_run

    run_dir = a.dir or tempfile.mkdtemp(prefix="hangtrace-bench-straggler-")
    os.makedirs(run_dir, exist_ok=True)
    try:
        took = write_run(run_dir, a.ranks, a.records, min(a.slow, a.ranks - 1))
        print(
            "wrote %d rings in %.1f s; slow rank %d" % (a.ranks, took, min(a.slow, a.ranks - 1)),
            file=sys.stderr,
        )
        loads, diags, passes = [], [], []
        d = st = None
        gc.disable()  # as `hangtrace analyze` runs (cli_diagnose.cmd_analyze)
        for _ in range(a.repeats):
            t0 = time.process_time()
            snap = load_run(run_dir)
            t1 = time.process_time()
            d = diagnose(snap)
            t2 = time.process_time()
            st = of_processes({p.rank: p for p in snap.processes if p.rank >= 0})
            t3 = time.process_time()
            loads.append(t1 - t0)
            diags.append(t2 - t1)
            passes.append(t3 - t2)
            del snap
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        load_s, diag_s, pass_s = (statistics.median(x) for x in (loads, diags, passes))
        assert d is not None
        print(
            "| ranks x records | load CPU s | diagnose CPU s | straggler pass CPU s | share of diagnose | of load+diagnose "
            "| peak RSS MiB | verdict | straggler |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        print(
            "| %d x %d | %.2f | %.2f | %.3f | %.0f %% | %.0f %% | %.0f | %s %s | %s |"
            % (
                a.ranks,
                a.records,
                load_s,
                diag_s,
                pass_s,
                100 * pass_s / diag_s,
                100 * pass_s / (load_s + diag_s),
                rss,
                d.kind,
                d.culprit_ranks,
                "rank %d, +%.1f ms/step, since step %s" % (st.rank, st.added_ms_per_step, st.since_step)
                if st
                else "none",
            )
        )
    finally:
        if not a.dir:
            shutil.rmtree(run_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
