"""Instructions and cache misses the C hot path adds per collective, counted by callgrind.

Timings of one collective on a shared 2-core machine move by hundreds of ns with the other
load; callgrind's counts do not. A world-size-1 gloo group does ``--calls`` 1-float
``all_reduce`` calls through hangtrace's installed wrapper (``_fastrec.Call``) under
``valgrind --tool=callgrind --cache-sim=yes --toggle-collect=Call_vectorcall``; what the
wrapper adds is its inclusive cost minus that of the call it wraps (the original torch
function), split by the functions it calls (torch's ``shape``/``dtype`` getters, the ring
write, ...). Each tree runs twice, ``--calls`` and twice as many calls: the per-call figure is
the difference divided by ``--calls``, the steady state without what happens once (the
first call's group entry, the tensor-layout probe, string interning). ``--baseline TREE``
counts another tree (its C extension built) the same way, side by side.

Cache figures are callgrind's simulation (its default L1/LL geometry), useful to compare
trees, not a measurement of this CPU. Needs valgrind and torch.

Usage::

    python3 benchmarks/bench_hotpath_callgrind.py [--calls 2000] [--baseline TREE] [--out results.json]
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TREE = os.path.dirname(HERE)
EVENTS = ("Ir", "Dr", "Dw", "I1mr", "D1mr", "D1mw", "ILmr", "DLmr", "DLmw")

CHILD = r"""
import socket, sys
import torch, torch.distributed as dist
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=0, world_size=1)
from hangtrace.hooks import _fastrec
assert isinstance(dist.all_reduce, _fastrec.Call), "not the C path: %r" % (dist.all_reduce,)
t = torch.ones(1)
ar = dist.all_reduce
for _ in range(int(sys.argv[1])):
    ar(t)
dist.destroy_process_group()
"""


def _parse(line):
    head = re.split(r"  [*>]  ", line)[0]
    toks = re.findall(r"([0-9,]+|\.)(?:\s+\([ 0-9.%]+\))?", head)
    return [0 if t == "." else int(t.replace(",", "")) for t in toks][: len(EVENTS)]


def _callee_name(line):
    name = re.split(r"  >   ", line, maxsplit=1)[1]
    name = re.sub(r" \([0-9,]+x\).*$", "", name)
    return name.split(":")[-1] if ":" in name else name


def measure_once(tree, calls, work):
    """Sums under the wrapper in ``tree`` after ``calls`` calls: ({event: n} of the wrapper's
    own cost, {callee: {event: n}})."""
    out = os.path.join(work, "cg.%s.%d" % (os.path.basename(tree.rstrip("/")), calls))
    script = os.path.join(work, "child.py")
    with open(script, "w") as f:
        f.write(CHILD)
    env = dict(
        os.environ,
        PYTHONPATH=tree,
        HANGTRACE="1",
        HANGTRACE_AUTO_WATCH="0",
        HANGTRACE_DIR=os.path.join(work, "run"),
        TORCH_FR_BUFFER_SIZE="0",
        OMP_NUM_THREADS="1",
        OPENBLAS_NUM_THREADS="1",
    )
    env.pop("HANGTRACE_PURE_PYTHON", None)
    p = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--cache-sim=yes",
            "--toggle-collect=Call_vectorcall",
            "--callgrind-out-file=" + out,
            sys.executable,
            script,
            str(calls),
        ],
        env=env,
        cwd=tree,
        capture_output=True,
        text=True,
    )
    if p.returncode != 0:
        raise SystemExit("callgrind run failed in %s:\n%s" % (tree, p.stderr[-2000:]))
    ann = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--tree=calling", out], capture_output=True, text=True
    ).stdout.split("\n")
    i = max(
        k
        for k, l in enumerate(ann)
        if "  *  " in l and l.rstrip().split("  *  ")[1].split(" [")[0].endswith(":Call_vectorcall")
    )
    total = _parse(ann[i])
    wrapped = None
    callees = {}
    for line in ann[i + 1 :]:
        if not line.strip():
            break
        v = _parse(line)
        if "PyObject_Vectorcall" in line and wrapped is None:
            wrapped = v
        else:
            c = callees.setdefault(_callee_name(line), dict.fromkeys(EVENTS, 0))
            for e, x in zip(EVENTS, v):
                c[e] += x
    if wrapped is None:
        raise SystemExit("no call of the wrapped function found under Call_vectorcall in %s" % tree)
    return {e: a - b for e, a, b in zip(EVENTS, total, wrapped)}, callees


def measure(tree, calls, work):
    """Per-call costs the wrapper adds in ``tree``, steady state (runs of ``calls`` and
    ``2 * calls`` calls, the difference): {"total": {event: n}, "callees": [(name, {event: n})]}."""
    own1, callees1 = measure_once(tree, calls, work)
    own2, callees2 = measure_once(tree, 2 * calls, work)
    own = {e: (own2[e] - own1[e]) / calls for e in EVENTS}
    zero = dict.fromkeys(EVENTS, 0)
    callees = [
        (name, {e: (c[e] - callees1.get(name, zero)[e]) / calls for e in EVENTS})
        for name, c in callees2.items()
    ]
    callees.sort(key=lambda c: -c[1]["Ir"])
    return {"total": own, "callees": [c for c in callees if c[1]["Ir"] >= 1]}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--baseline", help="another tree (its C extension built), counted the same way")
    ap.add_argument("--out", help="write JSON results here")
    a = ap.parse_args(argv)
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    trees = [("this tree", TREE)] + ([("baseline", os.path.abspath(a.baseline))] if a.baseline else [])
    work = tempfile.mkdtemp(prefix="ht-bench-cg-")
    try:
        res = {label: measure(tree, a.calls, work) for label, tree in trees}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(
        "### Added per all_reduce by the C wrapper (callgrind, steady state: runs of %d and %d calls,"
        " the difference per call; world-size-1 gloo)\n" % (a.calls, 2 * a.calls)
    )
    print("| tree | instructions | I1 misses | D1 read misses | D1 write misses | LL write misses |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, r in res.items():
        t = r["total"]
        print(
            "| %s | %.0f | %.1f | %.1f | %.1f | %.1f |"
            % (label, t["Ir"], t["I1mr"], t["D1mr"], t["D1mw"], t["DLmw"])
        )
    for label, r in res.items():
        print("\n%s, by callee (instructions per call):" % label)
        for name, c in r["callees"]:
            print("  %8.0f  %s" % (c["Ir"], name))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
