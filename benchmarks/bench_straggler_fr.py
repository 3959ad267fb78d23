"""The node watcher's Flight Recorder rounds for stragglers (issue 43, ``watch/stragglerfr.py``):
what one round costs, on each side.

1. **In the traced process** (always): torch's dump of a full Flight Recorder buffer (2000
   entries, the size hangtrace sets), exactly as the agent makes it
   (``_dump_fr_trace(True, False, False)``), in a world-size-1 gloo process: CPU time
   (``time.process_time``) per dump, median of ``--dumps`` dumps, and its size. Untraced:
   the dump alone, not our wrappers.
2. **In the watcher** (``--live RUN_DIR``, a job running under ``hangtrace run`` or with
   HANGTRACE_DIR=RUN_DIR, e.g. ``tests/integration/scripts/straggler_job.py --ddp``):
   ``--rounds`` rounds of ``FrLook`` over the live ranks of this host (ask each rank's agent
   for a dump, read them, join them with the rings, find the straggler): CPU time of the
   round (``time.thread_time``) and its wall time (the watcher's poll waits for it).

3. **The rings-only check** (``--check RUN_DIR``, any run directory: its ranks taken as
   live): ``StragglerWatch`` reading each rank's ring summary and judging it, ``--checks``
   times: CPU per check and the interval to the next one it chose (``stragglerwatch.interval``:
   a quarter of the history's span, 0.5-5 s, at least 50 x the check's CPU).

The share of a core the rounds take is the cost per round over ``stragglerfr.FR_EVERY_S``.

    PYTHONPATH=. python benchmarks/bench_straggler_fr.py [--dumps 30]
    PYTHONPATH=. python benchmarks/bench_straggler_fr.py --live RUN_DIR [--rounds 5]
    PYTHONPATH=. python benchmarks/bench_straggler_fr.py --check RUN_DIR [--checks 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)

CHILD = r"""
import os, socket, sys, time, statistics, torch, torch.distributed as dist
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=0, world_size=1)
t = torch.ones(1)
for _ in range(2500):
    dist.all_reduce(t)
dump = torch._C._distributed_c10d._dump_fr_trace
cpu = []
for _ in range(int(sys.argv[1])):
    t0 = time.process_time()
    data = dump(True, False, False)
    cpu.append(time.process_time() - t0)
import pickle
print(statistics.median(cpu) * 1e3, max(cpu) * 1e3, len(data), len(pickle.loads(data).get("entries", [])))
dist.destroy_process_group()
"""


def in_process(dumps: int) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HANGTRACE")}
    env["TORCH_FR_BUFFER_SIZE"] = "2000"
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(dumps)], env=env, capture_output=True, text=True, check=True
    )
    med, worst, size, entries = out.stdout.split()
    print(
        "traced process: one dump of %s entries (%d bytes): %.2f ms CPU median, %.2f ms max (%d dumps)"
        % (entries, int(size), float(med), float(worst), dumps)
    )


def live(run_dir: str, rounds: int) -> None:
    from hangtrace.tracer.analyze.straggler import find
    from hangtrace.tracer.watch import stragglerfr as SF
    from hangtrace.tracer.watch.progress import read_headers
    from hangtrace.tracer.watch.stragglerwatch import StragglerWatch

    fr = SF.FrLook(run_dir, time.monotonic)
    w = StragglerWatch(lambda line: None, time.monotonic)
    cpu, wall, named = [], [], []
    for _ in range(rounds):
        rings = w._ranks(read_headers(run_dir, {}), lambda p, h: True)
        c0, t0 = time.thread_time(), time.monotonic()
        fr.next = 0.0
        joined = fr.histories(rings)
        st = find(joined) if joined else None
        cpu.append(time.thread_time() - c0)
        wall.append(time.monotonic() - t0)
        named.append(None if st is None else st.rank)
        time.sleep(1.0)
    print(
        "watcher: one round over %d ranks: %.0f ms CPU median (max %.0f), %.2f s wall median (max %.2f); "
        "named %s; at one round per %.0f s: %.2f %% of a core"
        % (
            len(rings),
            statistics.median(cpu) * 1e3,
            max(cpu) * 1e3,
            statistics.median(wall),
            max(wall),
            named,
            SF.FR_EVERY_S,
            100 * statistics.median(cpu) / SF.FR_EVERY_S,
        )
    )


def check(run_dir: str, checks: int) -> None:
    from hangtrace.tracer.watch import stragglerwatch as SW
    from hangtrace.tracer.watch.progress import read_headers

    clock = [0.0]
    w = SW.StragglerWatch(lambda line: None, lambda: clock[0])
    headers = read_headers(run_dir, {})
    cpu, gaps = [], []
    for _ in range(checks):
        clock[0] = w.next
        c0 = time.thread_time()
        w.check(headers, lambda p, h: True)
        cpu.append(time.thread_time() - c0)
        gaps.append(w.next - clock[0])
    ranks = len({h.get("rank") for h in headers.values() if h.get("rank", -1) >= 0})
    print(
        "watcher: rings-only check over %d ranks: %.1f ms CPU median (max %.1f); next check after %.2f s "
        "(median): %.2f %% of a core; named %s"
        % (
            ranks,
            statistics.median(cpu) * 1e3,
            max(cpu) * 1e3,
            statistics.median(gaps),
            100 * statistics.median(cpu) / statistics.median(gaps),
            None if w.current is None else w.current["rank"],
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dumps", type=int, default=30)
    ap.add_argument("--live", help="a live run directory: rounds of the watcher against it")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--check", help="a run directory: the rings-only check over its ranks")
    ap.add_argument("--checks", type=int, default=20)
    a = ap.parse_args()
    print("load average %.1f" % os.getloadavg()[0])
    if a.check:
        check(a.check, a.checks)
        return
    in_process(a.dumps)
    if a.live:
        live(a.live, a.rounds)


if __name__ == "__main__":
    main()
