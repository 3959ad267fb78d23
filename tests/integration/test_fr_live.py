"""Flight Recorder on real gloo jobs (issue 10): the agent (started by our
init_process_group hook) dumps ranks blocked in a collective, also when a live snapshot asks;
torch's own dumps read by ``hangtrace analyze DIR``; the C++-issued DDP
all-reduce is named."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from jobs import REPO, base_env, kill_all, start_ranks, wait_line, wait_until

from hangtrace.tracer import pipeline
from hangtrace.tracer.analyze.diagnose import diagnose
from hangtrace.tracer.collect.frdump import load_fr_dir
from hangtrace.tracer.collect.rings import load_run_or_fr
from hangtrace.tracer.collect.frrequest import request_fr_dumps
from hangtrace.tracer.ring.frjoin import fr_processes
from hangtrace.tracer.snapshot import Snapshot

SCRIPT = os.path.join(REPO, "tests", "integration", "scripts", "fr_ddp_extra.py")
WORLD = 3


def _hung(dumps):
    """True when every rank's newest entry is not retired and all sit at one seq."""
    last = [d.entries[-1] for d in dumps if d.entries]
    return (
        len(last) == WORLD
        and not any(e.retired for e in last)
        and len({e.collective_seq_id for e in last}) == 1
    )


def test_agent_dumps_blocked_ranks_and_cpp_allreduce_is_named(tmp_path):
    run_dir = tmp_path / "run"
    procs = start_ranks(SCRIPT, WORLD, run_dir, args=("agent",), PYTHONPATH=REPO)
    try:
        for p in procs:
            wait_line(p, "HANGING")
        state = {}

        def ready():
            request_fr_dumps(str(run_dir), [p.pid for p in procs], timeout_s=10)
            state["dumps"] = load_fr_dir(str(run_dir))
            return _hung(state["dumps"])

        wait_until(ready, timeout=60, period=0.1)
        dumps = state["dumps"]
        assert sorted(d.rank for d in dumps) == [0, 1, 2] and all(d.pid for d in dumps)
        last = {d.rank: d.entries[-1] for d in dumps}
        assert last[2].profiling_name == "gloo:all_reduce" and last[2].input_sizes == ((676,),)
        assert last[0].profiling_name == last[1].profiling_name == "gloo:barrier"
        # dumps alone
        d = diagnose(Snapshot(run_dir=str(run_dir), processes=fr_processes(dumps)))
        assert d.kind == "collective-mismatch" and d.culprit_ranks == [2], d.summary
        # joined with our rings: the C++-issued all_reduce comes from the Flight Recorder only
        snap = load_run_or_fr(str(run_dir))
        d = diagnose(snap)
        assert d.kind == "collective-mismatch" and d.culprit_ranks == [2] and d.group == "0", d.summary
        by_rank = {p.rank: p for p in snap.processes}
        blocked2 = [r for r in by_rank[2].records if r["kind"] == "collective"][-1]
        assert blocked2["op"] == "all_reduce" and blocked2["source"] == "flight-recorder"
        assert blocked2["state"] == "issued" and blocked2["numel"] == 676
        blocked0 = [r for r in by_rank[0].records if r["kind"] == "collective"][-1]
        assert blocked0["op"] == "barrier" and blocked0["source"] == "hangtrace+flight-recorder"
        assert blocked0["seq"] == last[0].collective_seq_id and blocked0["seq_ours"] == 4
        # the Python-issued world all_reduces: the same numbers in both
        first = [r for r in by_rank[1].records if r.get("source") == "hangtrace+flight-recorder"][:3]
        assert [(r["op"], r["seq"], r["seq_ours"]) for r in first] == [
            ("all_reduce", i, i) for i in (1, 2, 3)
        ]
        # a live snapshot (the watcher's and `hangtrace dump`'s path) asks the agents itself,
        # keeps their dumps in the snapshot, and names the C++-issued collective
        res = pipeline.dump_live(str(run_dir), "request")
        assert res.diagnosis.kind == "collective-mismatch" and res.diagnosis.culprit_ranks == [2], (
            res.paragraph
        )
        assert len(list((Path(res.snapshot.path) / "fr").glob("*.pkl"))) == WORLD
        again = pipeline.diagnose_path(res.snapshot.path)  # read back later, job gone or not
        assert (again.diagnosis.kind, again.diagnosis.culprit_ranks) == ("collective-mismatch", [2])
        assert "all_reduce" in again.paragraph, again.paragraph
    finally:
        kill_all(procs)


def test_torch_written_dumps_read_by_analyze_dir(tmp_path):
    out = tmp_path / "dumps"
    out.mkdir()
    procs = start_ranks(SCRIPT, WORLD, None, traced=False, args=("torch", str(out)))
    try:
        for p in procs:
            wait_line(p, "HANGING")
        k = [0]

        def ready():
            k[0] += 1
            for r in range(WORLD):
                (out / ("go%d-%d" % (r, k[0]))).touch()
            wait_until(
                lambda: all((out / ("done%d-%d" % (r, k[0]))).exists() for r in range(WORLD)), timeout=30
            )
            return _hung(load_fr_dir(str(out)))

        wait_until(ready, timeout=60, period=0.1)
    finally:
        kill_all(procs)
    for f in out.glob("go*"):
        f.unlink()
    for f in out.glob("done*"):
        f.unlink()
    env = base_env(traced=False, PYTHONPATH=REPO)
    res = subprocess.run(
        [sys.executable, "-m", "hangtrace", "analyze", str(out), "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    assert d["kind"] == "collective-mismatch" and d["culprit_ranks"] == [2], d
    assert d["group"] == "0" and d["seq"] is not None


def test_cpp_only_collectives_are_progress_for_the_watcher(tmp_path):
    """A DDP job whose collectives are all C++-issued records nothing in the rings after
    init: before the Flight Recorder counters, the watcher held the 60 s start-up
    threshold and then called a healthy job stalled. Now torch's own counters are progress:
    no stall while it trains (12 s > the 3 s threshold), a stall soon after it hangs."""
    from hangtrace.tracer.watch.detector import Watcher

    script = os.path.join(REPO, "tests", "integration", "scripts", "ddp_slow_extra.py")
    run_dir = tmp_path / "run"
    procs = start_ranks(script, 2, run_dir, args=("24",), PYTHONPATH=REPO)
    try:
        wait_line(procs[0], "BATCH 0", timeout=120)
        w = Watcher(str(run_dir), stall_s=3.0)
        w.log = lambda line: None
        t_train = time.time()
        while time.time() - t_train < 10:  # 20 batches of C++ all-reduces, 0.5 s apart
            inc = w.poll()
            assert inc is None or inc.kind != "stall", inc.detail
            time.sleep(0.5)
        assert w.fr_started, "torch's counters never moved"
        for p in procs:
            wait_line(p, "HANGING", timeout=60)
        t_hang = time.time()
        inc = None
        while time.time() - t_hang < 30 and (inc is None or inc.kind != "stall"):
            inc = w.poll()
            time.sleep(0.5)
        assert inc is not None and inc.kind == "stall", "no stall reported within 30 s of the hang"
        assert time.time() - t_hang < 15, "stall reported only after %.1f s" % (time.time() - t_hang)
    finally:
        kill_all(procs)
