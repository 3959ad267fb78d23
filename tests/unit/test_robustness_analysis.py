"""Robustness of the offline analysis: implausible headers, memory facts, stopped jobs, wording."""

import dataclasses
import time
import tracemalloc

from hangtrace.tracer.analyze import memory as M
from hangtrace.tracer.analyze.diagnose import diagnose
from hangtrace.tracer.diagnosis import Diagnosis
from hangtrace.tracer.report.text import verdict_paragraph
from synth import S, ranks, snap


def test_huge_world_size_is_ignored_quickly():
    b = ranks(2)
    b[0].wait()
    procs = [x.build() for x in b]
    procs[1] = dataclasses.replace(procs[1], world_size=2**31 - 1)
    tracemalloc.start()
    t0 = time.time()
    d = diagnose(snap(procs))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert time.time() - t0 < 5 and peak < 50 * 2**20
    assert d.details["world_size"] == 2
    assert any("implausible world_size" in e and procs[1].key in e for e in d.evidence)


def test_rank_beyond_world_is_unranked():
    b = ranks(2)
    procs = [x.build() for x in b]
    procs[1] = dataclasses.replace(procs[1], rank=300000000)
    d = diagnose(snap(procs))
    assert d.details["world_size"] == 2 and d.details["missing_ranks"] == [1]
    assert any("implausible rank 300000000" in e for e in d.evidence)


def test_per_rank_trends_ignore_shared_cgroup():
    assert not M._primary([], "cgroup") and M._primary([], "rss")
    assert not M.significant_bytes(int(9.4 * 2**20), 2**40)
    assert M.significant_bytes(64 * 2**20) and M.significant_bytes(60 * 2**20, 2**30)
    mem = {"kept_across": [{"rank": 0, "bytes_kept_median": 9 * 2**20}], "trends": [], "ranks": {}}
    assert M.significant(mem, "stall") == ([], [])
    assert M.significant(mem, "cuda-oom")[0]


def test_all_killed_without_record_after_stall_keeps_hang():
    b = ranks(3)
    b[0].wait()
    b[1].wait()
    later = b[1].t + 3600 * S
    procs = [
        dataclasses.replace(p, state="killed", progress_wall_ns=later + p.rank)
        for p in (x.build() for x in b)
    ]
    d = diagnose(snap(procs))
    assert d.kind != "dead-rank", (d.kind, d.evidence)
    assert 2 in d.culprit_ranks
    assert any("stopped after it hung" in e for e in d.evidence)
    assert {c["rank"] for c in d.cascade} >= {0, 1}


def test_killed_without_record_wording():
    b = ranks(2)
    procs = [x.build() for x in b]
    procs[1] = dataclasses.replace(procs[1], state="killed")
    d = diagnose(snap(procs))
    assert "no exit record (SIGKILL, OOM kill, or stopped)" in (d.details.get("cause_text") or d.summary)


def test_report_wording():
    d = Diagnosis(kind="unknown", cause="no-data")
    assert "hangtrace snapshot" not in verdict_paragraph(d)
    m = Diagnosis(
        kind="collective-mismatch",
        culprit_ranks=[1],
        waiting_ranks=[0],
        details={"signatures": [{"op": "all_reduce", "ranks": [0]}, {"op": "broadcast", "ranks": [1]}]},
    )
    p = verdict_paragraph(m)
    assert "at ()" not in p and "()" not in p and "group and sequence number unknown" in p
