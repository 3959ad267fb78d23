"""The memory path of ``hangtrace analyze`` (issue 40): sample dicts vs sample columns, side by side.

For a run directory's rings (read once: ``collect/ringprocs.load_rings``), each round times,
in this process's CPU time and in rotating order:

* ``dicts``: what the analysis did before the columns - every process's memory records
  decoded into sample dicts at load (``ring/memsamples.samples``), then the memory summary
  (``analyze/memory/summary.summarize``) of the ranks reading those dicts;
* ``columns``: every process's records wrapped undecoded (``MemSamples``, as
  ``collect/ringprocs`` does now), then the same summary reading their columns
  (``analyze/memory/columns.py``, ``colledger.py``).

Both summaries must be equal (exit status 1 otherwise). Reports per round and the median:
load-side and summary-side CPU seconds, and the total per rank in ms.

    python benchmarks/bench_memory_path.py RUN_DIR [--rounds 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from typing import Any, Dict, List, Tuple

from hangtrace.tracer.analyze.memory import summarize
from hangtrace.tracer.collect.ringprocs import load_rings
from hangtrace.tracer.process_model import assign_roles
from hangtrace.tracer.ring.memsamples import MemSamples, samples


def _run(kind: str, procs: List[Any], focus: List[int]) -> Tuple[float, float, Any]:
    """(load CPU s, summary CPU s, summary) of one configuration."""
    t0 = time.process_time()
    if kind == "dicts":
        mem = [samples(list(p.memory.records())) for p in procs]
    else:
        mem = [MemSamples(p.memory.records(), from_ring=True) for p in procs]
    ps = [dataclasses.replace(p, memory=m) for p, m in zip(procs, mem)]
    t1 = time.process_time()
    out = summarize(dict(assign_roles(ps).ranks), focus)
    return t1 - t0, time.process_time() - t1, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    procs, _errors = load_rings(args.run_dir, live_facts=False)
    ranks = len(assign_roles(procs).ranks)
    focus = sorted(assign_roles(procs).ranks)[:2]
    print(
        "%d processes, %d ranks, %d memory records" % (len(procs), ranks, sum(len(p.memory) for p in procs))
    )
    got: Dict[str, List[Tuple[float, float]]] = {"dicts": [], "columns": []}
    kinds = ["dicts", "columns"]
    for i in range(args.rounds):
        results = {}
        for kind in kinds[i % 2 :] + kinds[: i % 2]:
            load, summ, results[kind] = _run(kind, procs, focus)
            got[kind].append((load, summ))
            print("round %d %-8s load %.3f s  summary %.3f s" % (i, kind, load, summ))
        if results["dicts"] != results["columns"]:
            print("the two summaries differ", file=sys.stderr)
            return 1
    print("\n| path | load CPU s | summary CPU s | total ms per rank |\n|---|---|---|---|")
    for kind in kinds:
        load = statistics.median(x[0] for x in got[kind])
        summ = statistics.median(x[1] for x in got[kind])
        print("| %s | %.3f | %.3f | %.2f |" % (kind, load, summ, 1000.0 * (load + summ) / max(ranks, 1)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
