"""Run-directory footprint of framework jobs (issue 40 item 3, issue 37 item 7).

Runs the clean variants of the blind framework jobs under ``hangtrace run --dir RUN``
(``tests/integration/blind/frameworks/raytrain/rt_clean.py``: Ray Train, 2 workers, 30
steps; ``lightning/lt_clean.py``: PyTorch Lightning DDP) and reports the run directory's
size on disk (``st_blocks``: rings are sparse files) and its apparent size, the rings by
size class (full rings of ranks/actors vs small rings of helpers and Ray's pooled workers),
the stack files (empty ones among them) and the snapshots. ``--dump N`` then takes N
``hangtrace dump`` snapshots of a finished run's directory and reports what they added.

    python benchmarks/bench_footprint.py [--jobs raytrain,lightning] [--dump 20] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, Tuple

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOBS = {
    "raytrain": os.path.join(HERE, "tests", "integration", "blind", "frameworks", "raytrain", "rt_clean.py"),
    "lightning": os.path.join(
        HERE, "tests", "integration", "blind", "frameworks", "lightning", "lt_clean.py"
    ),
}


def du(path: str) -> Tuple[int, int]:
    """(bytes on disk, apparent bytes) under ``path``, hard links counted once."""
    disk = app = 0
    seen = set()
    for root, _dirs, files in os.walk(path):
        for f in files:
            st = os.lstat(os.path.join(root, f))
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            disk += st.st_blocks * 512
            app += st.st_size
    return disk, app


def breakdown(run: str) -> Dict[str, object]:
    rings = [os.path.join(run, f) for f in os.listdir(run) if f.startswith("ring-")]
    sizes = [du_file(p) for p in rings]
    stacks = os.path.join(run, "stacks")
    sf = [os.path.join(stacks, f) for f in os.listdir(stacks)] if os.path.isdir(stacks) else []
    snaps = os.path.join(run, "snapshots")
    return {
        "rings": len(rings),
        "rings >= 1 MiB on disk": sum(1 for d in sizes if d >= 1 << 20),
        "ring MiB on disk": round(sum(sizes) / 2**20, 2),
        "stack files": len(sf),
        "empty stack files": sum(1 for p in sf if os.path.getsize(p) == 0),
        "snapshots": len(os.listdir(snaps)) if os.path.isdir(snaps) else 0,
        "snapshot MiB on disk": round(du(snaps)[0] / 2**20, 2) if os.path.isdir(snaps) else 0,
    }


def du_file(p: str) -> int:
    return os.lstat(p).st_blocks * 512


def run_job(name: str, run: str, code: str, timeout_s: float) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HANGTRACE")}
    env["PYTHONPATH"] = code
    t0 = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "hangtrace",
            "run",
            "--stall-s",
            "120",
            "--dir",
            run,
            "--",
            sys.executable,
            JOBS[name],
        ],
        env=env,
        cwd=os.path.dirname(JOBS[name]),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=timeout_s,
    )
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", default="raytrain,lightning")
    ap.add_argument("--dump", type=int, default=0, help="hangtrace dump snapshots taken after each job")
    ap.add_argument("--prev", default=None, help="also run with the code in DIR")
    ap.add_argument("--timeout-s", type=float, default=900.0)
    ap.add_argument("--keep", default=None, help="keep the run directories under DIR")
    a = ap.parse_args()
    base = a.keep or tempfile.mkdtemp(prefix="hangtrace-bench-footprint-")
    os.makedirs(base, exist_ok=True)
    print("| code | job | wall s | run dir MiB on disk (apparent) | breakdown | +%d dumps MiB |" % a.dump)
    print("|---|---|---|---|---|---|")
    try:
        for code_name, code in [("this", HERE)] + ([("previous", a.prev)] if a.prev else []):
            for name in a.jobs.split(","):
                run = os.path.join(base, "%s-%s" % (code_name, name))
                wall = run_job(name, run, code, a.timeout_s)
                disk, app = du(run)
                b = breakdown(run)
                before = disk
                env = dict(
                    {k: v for k, v in os.environ.items() if not k.startswith("HANGTRACE")}, PYTHONPATH=code
                )
                for _ in range(a.dump):
                    subprocess.run(
                        [sys.executable, "-m", "hangtrace", "dump", run],
                        env=env,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                        timeout=300,
                    )
                added = (du(run)[0] - before) / 2**20
                print(
                    "| %s | %s | %.0f | %.1f (%.1f) | %s | %.1f |"
                    % (code_name, name, wall, disk / 2**20, app / 2**20, b, added),
                    flush=True,
                )
    finally:
        if not a.keep:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
