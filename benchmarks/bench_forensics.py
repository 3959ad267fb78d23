"""Cost of recording what a traced process runs (issue 12), side by side in one run.

A child interpreter imports ``torch.distributed`` (so its maps hold torch's libraries, as
in a real rank) and then, interleaved round by round, times:

  record-first    ``collect_self`` with no previous record + ``write``: read
                  /proc/self/maps, stat and read the build-id (struct reader) of every
                  library that matters, mask the environment, write the JSON file (what
                  the bootstrap and torch-import records cost)
  record-no-packages  the same without the imported packages' versions (issue 41): the
                  record as it was before, side by side
  record-again    the same with the previous record reused (what a ctypes-load record costs)
  packages-first  the packages' versions with empty caches (a process's first record pays
                  it once; forks inherit the caches); record-first has them cached
  packages-again  the same, cached (every later record)
  elftools-ids    the build-ids of the same libraries through pyelftools' note iterator
                  (module already imported): the alternative we did not take in-process
  elftools-all-mapped  every mapped file's build-id through pyelftools: what env-diff would
                  cost if it read all of a rank's libraries (it reads the ambiguous ones only)

and, in a fresh child each round, ``import elftools.elf.elffile`` (the import alone).
Each figure is the median over the rounds, in ms (wall, and the thread's CPU time: the
machine is shared); the ratio column is against ``record-first``. The child's own ``import torch.distributed`` time is printed for scale.

``--callgrind``: the instructions of one record without the packages, with them (a
process's first record) and with them again, under callgrind (independent of the load).

Usage::

    python3 benchmarks/bench_forensics.py [--rounds 15] [--out results.json]
    python3 benchmarks/bench_forensics.py --callgrind
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
from hangtrace.hooks.env import pkgversions as P
from hangtrace.tracer.collect import elffacts as X
all_pkgs = P.loaded_packages
names = ["record-first", "record-no-packages", "record-again", "packages-first", "packages-again",
         "elftools-ids", "elftools-all-mapped"]
out = {k: [] for k in names}
cpu = {k: [] for k in names}
prev = None
for i in range(rounds):
    for name in (names if i % 2 == 0 else names[::-1]):
        t, c = time.perf_counter(), time.thread_time()
        if name == "record-first":
            pe = F.collect_self("bench", previous=None)
            F.write(run_dir, pe)
            prev = pe
        elif name == "record-no-packages":  # the record as it was before issue 41's packages
            P.loaded_packages = dict
            try:
                F.write(run_dir, F.collect_self("bench", previous=None))
            finally:
                P.loaded_packages = all_pkgs
        elif name == "record-again":
            F.write(run_dir, F.collect_self("bench", previous=prev))
        elif name == "packages-first":  # a process's first record: every module resolved
            for cache in (P._dists, P._tops, P._read, P._resolved):
                cache.clear()
            pkgs = P.loaded_packages()
        elif name == "packages-again":
            P.loaded_packages()
        elif name == "elftools-ids":
            ids = [F._elftools_build_id(lb.path) for lb in prev.libraries]
        else:  # what reading every mapped file at analysis time would cost (not done: elffacts)
            X._cache.clear()
            for path in {m.path for m in prev.mappings}:
                X.elf_build_id(path)
        out[name].append((time.perf_counter() - t) * 1e3)
        cpu[name].append((time.thread_time() - c) * 1e3)
assert [lb.build_id for lb in prev.libraries] == ids  # both readers agree
assert "torch" in pkgs, pkgs
print(json.dumps({"samples": out, "cpu": cpu, "torch_import_ms": t_torch * 1e3, "libraries": len(prev.libraries),
                  "mappings": len(prev.mappings), "files": len({m.path for m in prev.mappings}),
                  "packages": len(pkgs)}))
"""


CG_CHILD = r"""
import os, sys, tempfile
import torch.distributed
from hangtrace.hooks.env import envcollect as C, pkgversions as P
run_dir = tempfile.mkdtemp(prefix="bench-forensics-cg-")
with_packages = P.loaded_packages
P.loaded_packages = dict
C.write_record(run_dir, C.snapshot("warm", "h", {}))  # maps parsed, env dir made: not counted
mark = os.getloadavg  # each call: callgrind writes the instructions since the last one
mark()
C.write_record(run_dir, C.snapshot("before", "h", {}))  # without the packages (the libraries read again)
mark()
P.loaded_packages = with_packages
C.write_record(run_dir, C.snapshot("first", "h", {}))  # with them: this process's first
mark()
C.write_record(run_dir, C.snapshot("again", "h", {}))  # with them, cached
mark()
sys.stderr.write("PACKAGES %d\n" % len(P.loaded_packages()))
"""


def callgrind() -> int:
    """``--callgrind``: instructions of one record without the packages' versions, with them
    (a process's first record), and with them again, in one child under callgrind
    (instruction counts do not depend on the machine's load)."""
    import glob
    import shutil
    import tempfile

    if shutil.which("valgrind") is None:
        raise SystemExit("needs valgrind (apt-get install valgrind)")
    work = tempfile.mkdtemp(prefix="bench-forensics-cg-")
    try:
        script = os.path.join(work, "child.py")
        with open(script, "w") as f:
            f.write(CG_CHILD)
        env = {k: v for k, v in os.environ.items() if not k.startswith("HANGTRACE")}
        env.update(PYTHONPATH=REPO, PYTHONHASHSEED="0", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
        out = os.path.join(work, "cg.out")
        cmd = ["valgrind", "--tool=callgrind", "--dump-before=*getloadavg*", "--callgrind-out-file=" + out]
        p = subprocess.run(cmd + [sys.executable, script], env=env, capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit("callgrind run failed (%d):\n%s" % (p.returncode, p.stderr[-2000:]))
        files = sorted(glob.glob(out + ".*"), key=lambda x: int(x.rsplit(".", 1)[1]))
        counts = []
        for path in files:
            with open(path) as f:
                counts.append(next(int(ln.split()[1]) for ln in f if ln.startswith("summary:")))
        print("dumps (instructions): %s" % counts)
        # each mark dumps twice (os.getloadavg, then libc's getloadavg: a few hundred
        # instructions between): the segments are the large ones after the import's
        counts = [n for n in counts if n > 20000][1:4]
        pk = [ln for ln in p.stderr.splitlines() if ln.startswith("PACKAGES ")]
        print("imported packages with installed metadata: %s" % (pk[0].split()[1] if pk else "?"))
        print("\n| record | instructions (M) | × without packages |\n|---|---|---|")
        for name, n in zip(("without packages", "with packages, first", "with packages, again"), counts):
            print("| %s | %.2f | %.2f |" % (name, n / 1e6, n / counts[0]))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--out", default=None)
    ap.add_argument(
        "--callgrind", action="store_true", help="instructions of the record with and without packages"
    )
    args = ap.parse_args()
    if args.callgrind:
        return callgrind()
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
    cpu = {k: statistics.median(v) for k, v in res["cpu"].items()}
    base = med["record-first"]
    print(
        "child: import torch.distributed %.0f ms; %d libraries that matter, %d executable mappings "
        "(%d files), %d imported packages with installed metadata"
        % (res["torch_import_ms"], res["libraries"], res["mappings"], res["files"], res["packages"])
    )
    print("\n| what | median ms | median thread CPU ms | × record-first |\n|---|---|---|---|")
    for k in list(res["samples"]):
        print("| %s | %.2f | %s | %.1f |" % (k, med[k], "%.2f" % cpu[k] if k in cpu else "-", med[k] / base))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(res, medians=med), f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
