"""Overhead of the deep trace (issue 11), off vs on, side by side in one run.

Three traced child processes (``HANGTRACE=1``, the .pth bootstrap as in a job, ``RANK=0``)
run the same Python training-step loop (per step ``tracer.step``, phase ``rollout`` then
phase ``train``; the work is plain Python function calls — a small MLP in lists —, the
worst case for a profile hook), interleaved round by round so machine drift hits all alike:

  off        ``HANGTRACE_DEEP`` unset: viztracer never imported
  other-rank ``HANGTRACE_DEEP="rank=1,phase=train"``: this process (rank 0) is not selected
  on         ``HANGTRACE_DEEP="rank=0,phase=train"``: viztracer runs inside ``train``

Each round a child runs ``--steps`` steps and prints the median step time in CPU time of
the process (``time.process_time``: on a shared, loaded machine wall time mostly measures
the wait for a core); the table gives the median over rounds, and the median over rounds
of the ratio to ``off`` in the same round.

Usage::

    python3 benchmarks/bench_deep.py [--rounds 8] [--steps 40] [--out results.json]
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import sys, time
from hangtrace import tracer
import random

def dot(a, b):
    return sum(x * y for x, y in zip(a, b))

def layer(w, x):
    return [max(0.0, dot(row, x)) for row in w]

def step_work(w1, w2, x):
    return layer(w2, layer(w1, x))

random.seed(0)
W1 = [[random.random() for _ in range(32)] for _ in range(32)]
W2 = [[random.random() for _ in range(32)] for _ in range(32)]
X = [random.random() for _ in range(32)]
times = []
for n in range(int(sys.argv[1])):
    t0 = time.process_time()
    tracer.step(n)
    with tracer.phase("rollout", step=n):
        step_work(W1, W2, X)
    with tracer.phase("train", step=n):
        for _ in range(4):
            step_work(W1, W2, X)
    times.append(time.process_time() - t0)
times.sort()
print("MEDIAN_US %.1f" % (times[len(times) // 2] * 1e6), "VIZ", "viztracer" in sys.modules, flush=True)
"""

MODES = {"off": None, "other-rank": "rank=1,phase=train", "on": "rank=0,phase=train"}


def run_child(mode, steps, run_dir):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HANGTRACE")}
    env.update(
        HANGTRACE="1",
        HANGTRACE_AUTO_WATCH="0",
        HANGTRACE_DIR=run_dir,
        RANK="0",
        HANGTRACE_MEM="0",
        PYTHONPATH=REPO + os.pathsep + env.get("PYTHONPATH", ""),
    )
    if MODES[mode]:
        env["HANGTRACE_DEEP"] = MODES[mode]
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(steps)], env=env, capture_output=True, text=True, timeout=600
    )
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    m = re.search(r"MEDIAN_US ([\d.]+) VIZ (\w+)", out.stdout)
    return float(m.group(1)), m.group(2) == "True"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    res = {m: [] for m in MODES}
    imported = {}
    with tempfile.TemporaryDirectory(prefix="bench_deep_") as d:
        for i in range(a.rounds):
            for m in MODES:
                us, viz = run_child(m, a.steps, os.path.join(d, "%s-%d" % (m, i)))
                res[m].append(us)
                imported[m] = viz
    print(
        "| mode | HANGTRACE_DEEP | viztracer imported | step CPU time, median (us) | vs off (median of rounds) |"
    )
    print("|---|---|---|---|---|")
    for m, v in res.items():
        ratio = statistics.median(x / y for x, y in zip(v, res["off"]))
        print(
            "| %s | %s | %s | %.0f | %.2fx |"
            % (m, MODES[m] or "(unset)", "yes" if imported[m] else "no", statistics.median(v), ratio)
        )
    if a.out:
        with open(a.out, "w") as f:
            json.dump(
                {"rounds": a.rounds, "steps": a.steps, "step_us": res, "viztracer_imported": imported},
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
