"""The watcher's CPU per poll at N local processes (issue 40, item 4).

Starts ``--procs`` idle local processes (``sleep``), gives each a real ring (recorded by
the real ``Recorder``: a rank of an N-rank job that joined the world group and made a few
steps; the header then names the sleeping process: pid and start ticks, so every ring is a
live local process to the watcher), then runs ``Watcher.poll()`` ``--polls`` times in this
process and reports CPU time per poll (``time.process_time``) in two cases: nothing
changed between polls, and one ring changed (a step recorded) before each poll. Wall time
is printed too; CPU is the figure to compare on a loaded machine.

    python benchmarks/bench_watch_poll.py [--procs 64] [--polls 200] [--prev DIR]

``--prev DIR`` runs the same measurement with the code in DIR (``PYTHONPATH=DIR``, a
separate process) on the same rings, side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_rings(run_dir: str, pids: List[int]) -> List[str]:
    """One ring per pid (see the module docstring); returns their paths."""
    from hangtrace.hooks.record.recorder import Recorder
    from hangtrace.tracer.ring import layout as F

    out = []
    for rank, pid in enumerate(pids):
        rec = Recorder(run_dir, "bench-watch", 16384, lambda *a: None)
        rec.set_rank(rank, rank, len(pids))
        rec.group_created(
            {"op": "init_process_group", "name": "0", "ranks": list(range(len(pids))), "member": True}
        )
        for n in range(5):
            rec.step(n)
        path = rec.path
        rec.close()
        with open(path, "r+b") as f:
            buf = bytearray(f.read(F.HEADER_SIZE))
            _p, ppid, wall, mono, _t = F.IDENT.unpack_from(buf, F.IDENT_OFF)
            F.IDENT.pack_into(buf, F.IDENT_OFF, pid, ppid, wall, mono, F.proc_start_ticks(pid))
            f.seek(0)
            f.write(buf)
        new = os.path.join(run_dir, "ring-%s-%d.htr" % (os.uname().nodename, pid))
        os.rename(path, new)
        out.append(new)
    return out


def measure(run_dir: str, polls: int) -> Dict[str, Any]:
    """CPU and wall seconds per poll: nothing changed / one ring changed before each poll."""
    from hangtrace.tracer.ring import layout as F
    from hangtrace.tracer.watch.detector import Watcher

    try:  # as the watcher's entry points do (collect/pidwatch.py; absent in older trees)
        from hangtrace.tracer.collect import pidwatch

        pidwatch.enable(F.proc_start_ticks)
    except ImportError:
        pass
    # imported once by the watcher's first straggler and memory checks: not a poll's cost
    import hangtrace.tracer.analyze.memory  # noqa: F401
    import hangtrace.tracer.analyze.straggler  # noqa: F401
    import hangtrace.tracer.report.stragglertext  # noqa: F401

    w = Watcher(run_dir, stall_s=3600.0)
    w.log = w.mem_log = lambda s: None
    w.poll()
    res: Dict[str, Any] = {}
    rings = sorted(p for p in os.listdir(run_dir) if p.startswith("ring-"))
    for case in ("unchanged", "one changed"):
        c0, t0 = time.process_time(), time.perf_counter()
        for i in range(polls):
            if case == "one changed":  # a step: the progress counter of one ring moves
                with open(os.path.join(run_dir, rings[i % len(rings)]), "r+b") as f:
                    f.seek(F.LIVE_DONE_OFF)
                    b = bytearray(f.read(F.LIVE_DONE.size))
                    a, m, wl, cnt = F.LIVE_DONE.unpack_from(b)
                    f.seek(F.LIVE_DONE_OFF)
                    f.write(F.LIVE_DONE.pack(a, time.monotonic_ns(), time.time_ns(), cnt + 1))
            w.poll()
        res[case] = {
            "cpu_ms_per_poll": (time.process_time() - c0) * 1000 / polls,
            "wall_ms_per_poll": (time.perf_counter() - t0) * 1000 / polls,
        }
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--procs", type=int, default=64)
    ap.add_argument("--polls", type=int, default=200)
    ap.add_argument("--prev", default=None)
    ap.add_argument("--measure", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.measure:
        print(json.dumps(measure(a.measure, a.polls)))
        return 0
    sys.path.insert(0, HERE)
    sleepers = [subprocess.Popen(["sleep", "600"]) for _ in range(a.procs)]
    run_dir = tempfile.mkdtemp(prefix="hangtrace-bench-watch-")
    try:
        make_rings(run_dir, [p.pid for p in sleepers])
        print("| code | local processes | CPU ms/poll, unchanged | CPU ms/poll, one changed | wall ms/poll |")
        print("|---|---|---|---|---|")
        for name, code in [("this", HERE)] + ([("previous", a.prev)] if a.prev else []):
            out = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--measure", run_dir, "--polls", str(a.polls)],
                env=dict(os.environ, PYTHONPATH=code),
                capture_output=True,
                text=True,
                check=True,
            )
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(
                "| %s | %d | %.2f | %.2f | %.2f |"
                % (
                    name,
                    a.procs,
                    r["unchanged"]["cpu_ms_per_poll"],
                    r["one changed"]["cpu_ms_per_poll"],
                    r["unchanged"]["wall_ms_per_poll"],
                )
            )
    finally:
        for p in sleepers:
            p.kill()
            p.wait()
        shutil.rmtree(run_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
