"""Where a traced start-up's instructions go, by segment (issue 8), under callgrind.

Runs one traced ``import torch.distributed`` (bootstrap called by hand, so that each part
can be marked), and beside it an untraced one, each under ``valgrind --tool=callgrind --dump-before=*getloadavg*``: every
marker is an ``os.getloadavg()`` call, which makes callgrind write the instructions since
the previous marker to a file of its own. Segments: importing ``bootstrap``, ``activate``
(the ring, the instrumentors' modules and installs), torch's import up to the
torch.distributed hook, the hook, each environment record written, the rest of the
import, and the exit. Instruction counts do not depend on the machine's load.

    python3 benchmarks/startup_segments.py            # prints a table; about 3 minutes
    python3 benchmarks/startup_segments.py --native 40   # + ours timed natively, the whole at that rate

Bytecode is cached outside the tree (``PYTHONPYCACHEPREFIX``) and written first by a
native run, as a real install has it; ``PYTHONHASHSEED=0``; OpenBLAS/OpenMP on one thread;
the memory sampler's interval stretched to 100 s (callgrind's slowdown), as in
``bench_startup.py --callgrind``. Needs valgrind and torch.
"""

import argparse
import glob
import os
import statistics
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

from benchstats import median_ci

CHILD = r"""
import os, sys, time
_mark = os.getloadavg
labels = []
times = []
_native = os.environ.get("HT_SEG_NATIVE") == "1"
def M(label):
    labels.append(label)
    if _native:
        times.append((time.process_time_ns(), time.perf_counter_ns()))
    else:
        _mark()
os.environ["HANGTRACE"] = "1"
M("start")
import hangtrace.hooks.bootstrap as b
from hangtrace.hooks import libraries
from hangtrace.hooks.env import envrecord
orig_rec = envrecord.record
def rec(rt, reason):
    M("(before the record)"); orig_rec(rt, reason); M("environment record (%s)" % reason)
envrecord.record = rec
orig_on = libraries.TorchDistInstrumentor._on_import
def on(self, m):
    M("torch's import until torch.distributed is hooked"); orig_on(self, m); M("hooking torch.distributed")
libraries.TorchDistInstrumentor._on_import = on
M("importing bootstrap")
b.activate()
M("activate (ring, instrumentors)")
import torch.distributed
M("the rest of torch's import")
sys.stderr.write("LABELS " + "|".join(labels) + "\n")
sys.stderr.write("BUNDLE %r\n" % (sys.modules["hangtrace.hooks.preload"].status(),))
if _native:
    sys.stderr.write("TIMES " + " ".join("%d,%d" % t for t in times) + "\n")
"""


UNTRACED = r"""
import os, sys
os.getloadavg()
import torch.distributed
os.getloadavg()
"""


def _summary(path: str) -> int:
    with open(path) as f:
        for line in f:
            if line.startswith("summary:"):
                return int(line.split()[1])
    raise ValueError("no summary line in %s" % path)


def _dumps(out: str) -> list:
    return sorted(glob.glob(out + ".*"), key=lambda x: int(x.rsplit(".", 1)[1]))


def _callgrind(script: str, env: dict, out: str, labelled: bool) -> tuple:
    """(marker labels, out file) of one run of ``script`` under callgrind; ``labelled``:
    the script prints its markers' labels. Raises SystemExit when the run fails."""
    p = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--dump-before=*getloadavg*",
            "--callgrind-out-file=" + out,
            sys.executable,
            script,
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("LABELS ")]
    if p.returncode != 0 or (labelled and not lines):
        raise SystemExit("callgrind run failed (%d):\n%s" % (p.returncode, p.stderr[-2000:]))
    return (lines[0][7:].split("|") if lines else []), out


def _native(script: str, env: dict, runs: int) -> list:
    """CPU and wall time (ms) of ours before torch's import (importing bootstrap, activate)
    in ``runs`` native runs of the traced child: ``[(cpu_ms, wall_ms), ...]``, measured in
    the child (``time.process_time_ns``, ``time.perf_counter_ns``) at the same markers."""
    out = []
    for _ in range(runs):
        p = subprocess.run(
            [sys.executable, script], env=dict(env, HT_SEG_NATIVE="1"), capture_output=True, text=True
        )
        lines = [ln for ln in p.stderr.splitlines() if ln.startswith("TIMES ")]
        if p.returncode != 0 or not lines:
            raise SystemExit("native run failed (%d):\n%s" % (p.returncode, p.stderr[-2000:]))
        t = [tuple(int(x) for x in pair.split(",")) for pair in lines[0][6:].split()]
        out.append(((t[2][0] - t[0][0]) / 1e6, (t[2][1] - t[0][1]) / 1e6))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--native",
        type=int,
        default=0,
        metavar="N",
        help="also time ours before torch's import natively in N runs, and convert the "
        "instructions of every segment of ours at that rate (ns per instruction)",
    )
    a = ap.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("needs valgrind (apt-get install valgrind)")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    work = tempfile.mkdtemp(prefix="ht-startup-seg-")
    try:
        script = os.path.join(work, "child.py")
        with open(script, "w") as f:
            f.write(CHILD)
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("HANGTRACE") and k != "PYTHONDONTWRITEBYTECODE"
        }
        env.update(
            PYTHONPATH=repo,
            PYTHONPYCACHEPREFIX=os.path.join(work, "pycache"),
            PYTHONHASHSEED="0",
            OMP_NUM_THREADS="1",
            OPENBLAS_NUM_THREADS="1",
            MKL_NUM_THREADS="1",
            HANGTRACE_AUTO_WATCH="0",
            HANGTRACE_MEM_INTERVAL_S="100",
            HANGTRACE_DIR=os.path.join(work, "run"),
        )
        plain = os.path.join(work, "untraced.py")
        with open(plain, "w") as f:
            f.write(UNTRACED)
        # the start-up bundle (hooks/preload.py) built as setup.sh builds it, and the bytecode cache
        subprocess.run(
            [sys.executable, "-c", "from hangtrace.hooks import preload; preload.refresh()"],
            env=env,
            check=True,
        )
        first = subprocess.run([sys.executable, script], env=env, check=True, capture_output=True, text=True)
        print(
            "start-up bundle: "
            + " ".join(ln[7:] for ln in first.stderr.splitlines() if ln.startswith("BUNDLE "))
        )
        runs = {}
        with ThreadPoolExecutor(2) as pool:  # (the two runs side by side: counts do not depend on load)
            for name, path in (("traced", script), ("untraced", plain)):
                runs[name] = pool.submit(
                    _callgrind, path, env, os.path.join(work, name + ".out"), name == "traced"
                )
        (labels, out), (_, plain_out) = runs["traced"].result(), runs["untraced"].result()
        dumps = _dumps(out)
        rows = []
        for i, label in enumerate(labels[1:]):
            # two dumps per marker call (callgrind matches two functions of the call; the
            # second holds a handful of instructions): the segment ending at marker k
            # (k >= 1) is file 2k+1, counted from 1; the exit is the final file
            n = _summary(dumps[2 + 2 * i])
            rows.append(("  (until the next record)" if label.startswith("(") else label, n))
        rows.append(("the exit (interpreter finalization)", _summary(out)))
        torch_traced = sum(n for label, n in rows if "torch" in label or "record" in label)
        torch_plain = _summary(_dumps(plain_out)[2])
        exit_plain = _summary(plain_out)
        print("| segment | instructions (M) |\n|---|---:|")
        for label, n in rows:
            print("| %s | %.2f |" % (label, n / 1e6))
        print(
            "| **ours before torch's import** (importing bootstrap, activate) | **%.2f** |"
            % (sum(n for label, n in rows[:2]) / 1e6)
        )
        print(
            "| torch's import, traced minus untraced (%.1fM), hooks and records included | **%+.2f** |"
            % (torch_plain / 1e6, (torch_traced - torch_plain) / 1e6)
        )
        ours = sum(n for label, n in rows[:2])
        d_torch, d_exit = torch_traced - torch_plain, rows[-1][1] - exit_plain
        print("| the exit, traced minus untraced (%.1fM) | **%+.2f** |" % (exit_plain / 1e6, d_exit / 1e6))
        if a.native:
            times = _native(script, env, a.native)
            cpu, wall = [c for c, _ in times], [w for _, w in times]
            lo, hi = median_ci(cpu)
            rate = statistics.median(cpu) * 1e6 / ours
            total = ours + d_torch + d_exit
            print(
                "\nNative, %d runs (load %.1f): ours before torch's import **%.2f ms CPU** [95 %% CI %.2f, %.2f], "
                "wall %.2f ms (p10-p90 %.2f-%.2f): %.3f ns per instruction. All of ours (%.2fM instructions: "
                "before torch's import, inside it, at exit) at that rate: **%.2f ms** [%.2f, %.2f]."
                % (
                    a.native,
                    os.getloadavg()[0],
                    statistics.median(cpu),
                    lo,
                    hi,
                    statistics.median(wall),
                    *statistics.quantiles(wall, n=10)[0::8],
                    rate,
                    total / 1e6,
                    rate * total / 1e6,
                    lo * total / ours,
                    hi * total / ours,
                )
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
