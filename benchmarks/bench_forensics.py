"""Cost of recording what a traced process runs (issue 12), side by side in one run.

A child interpreter imports ``torch.distributed`` (so its maps hold torch's libraries, as
in a real rank) and then, interleaved round by round, times:

  record-first    ``collect_self`` with no previous record + ``write``: read
                  /proc/self/maps, stat and read the build-id (struct reader) of every
                  library that matters, mask the environment, write the JSON file (what
                  the bootstrap and torch-import records cost)
  record-again    the same with the previous record reused (what a ctypes-load record costs)
  elftools-ids    the build-ids of the same libraries through pyelftools' note iterator
                  (module already imported): the alternative we did not take in-process

and, in a fresh child each round, ``import elftools.elf.elffile`` (the import alone).
Each figure is the median over the rounds, in ms; the ratio column is against
``record-first``. The child's own ``import torch.distributed`` time is printed for scale.

Usage::

    python3 benchmarks/bench_forensics.py [--rounds 15] [--out results.json]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import json, os, sys, tempfile, time
t0 = time.perf_counter()
import torch.distributed
t_torch = time.perf_counter() - t0
from hangtrace.tracer.collect import forensics as F
run_dir = tempfile.mkdtemp(prefix="bench-forensics-")
rounds = int(sys.argv[1])
F.collect_self("warm")  # page cache and module warm-up, not timed
from elftools.elf.elffile import ELFFile  # noqa: F401  (imported: elftools-ids times the reading only)
out = {"record-first": [], "record-again": [], "elftools-ids": []}
prev = None
for i in range(rounds):
    for name in (out if i % 2 == 0 else list(out)[::-1]):
        t = time.perf_counter()
        if name == "record-first":
            pe = F.collect_self("bench", previous=None)
            F.write(run_dir, pe)
            prev = pe
        elif name == "record-again":
            F.write(run_dir, F.collect_self("bench", previous=prev))
        else:
            ids = [F._elftools_build_id(lb.path) for lb in prev.libraries]
        out[name].append((time.perf_counter() - t) * 1e3)
assert [lb.build_id for lb in prev.libraries] == ids  # both readers agree
print(json.dumps({"samples": out, "torch_import_ms": t_torch * 1e3, "libraries": len(prev.libraries),
                  "mappings": len(prev.mappings)}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HANGTRACE")}
    env["PYTHONPATH"] = REPO
    p = subprocess.run(
        [sys.executable, "-c", CHILD, str(args.rounds)], env=env, capture_output=True, text=True, check=True
    )
    res = json.loads(p.stdout.strip().splitlines()[-1])
    imports = []
    for _ in range(args.rounds):
        q = subprocess.run(
            [
                sys.executable,
                "-c",
                "import time; t=time.perf_counter(); "
                "import elftools.elf.elffile; print((time.perf_counter()-t)*1e3)",
            ],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        imports.append(float(q.stdout.strip()))
    res["samples"]["elftools-import"] = imports
    med = {k: statistics.median(v) for k, v in res["samples"].items()}
    base = med["record-first"]
    print(
        "child: import torch.distributed %.0f ms; %d libraries that matter, %d executable mappings"
        % (res["torch_import_ms"], res["libraries"], res["mappings"])
    )
    print("\n| what | median ms | × record-first |\n|---|---|---|")
    for k in ("record-first", "record-again", "elftools-ids", "elftools-import"):
        print("| %s | %.2f | %.1f |" % (k, med[k], med[k] / base))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(res, medians=med), f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
