"""`hangtrace dump` judges a live job over a window, not an instant (issue 38, item 1).

Measured 2026-12-07 before the window: a point-in-time `dump` of this healthy 3-rank
torchrun + DDP + DataLoader job gave a hang verdict in 1 of 25 snapshots on a quiet
machine and 4 of 37 at load 6-8 (and 4 of 8 on 2026-12-07 09:05 in this worktree).
N dumps per test: 4 (CI time), or 100 with HANGTRACE_LONG=1. The counts are printed (-s).
"""

import json
import os
import subprocess
import sys

import pytest

from ddp_jobs import TORCHRUN, burner, descendants, rank_pids, start_job, step_of, stop, wait_file
from jobs import base_env, blocked, long_only, wait_until

N = 100 if os.environ.get("HANGTRACE_LONG") == "1" else 4
HANG_KINDS = {
    "collective-mismatch",
    "skipped-collective",
    "cross-group-deadlock",
    "stuck-outside-collective",
    "dead-rank",
    "transport-error",
}

pytestmark = pytest.mark.skipif(TORCHRUN is None, reason="torchrun not on PATH")


def dump(run, tmp_path, *extra):
    out = subprocess.run(
        [sys.executable, "-m", "hangtrace", "dump", str(run), "--json", *extra],
        env=base_env(traced=False, TMPDIR=tmp_path),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


#: quiet (only with HANGTRACE_LONG=1: CI's 25-minute budget) and beside a CPU burner
LOADED = pytest.mark.parametrize(
    "loaded",
    [pytest.param(False, marks=long_only("the loaded variant runs by default")), True],
    ids=["quiet", "cpu-burner"],
)


def _load():
    return os.getloadavg()[0]


@pytest.mark.timeout(300 + 40 * N)
@LOADED
def test_dumps_of_a_healthy_training_job_are_never_hung(tmp_path, loaded):
    job, out, run = start_job(tmp_path, traced=True)
    hot = None
    try:
        wait_file(job, out, pred=lambda o: step_of(o) >= 5)
        hot = burner() if loaded else None
        kinds, loads = [], []
        for _ in range(N):
            d = dump(run, tmp_path)
            kinds.append((d["kind"], d.get("cause"), d["culprit_ranks"], d["summary"][:160]))
            loads.append(_load())
        first = step_of(out)
        wait_file(job, out, pred=lambda o: step_of(o) > first)  # still training after the dumps
        hung = [k for k in kinds if k[0] in HANG_KINDS or k[0] == "unknown"]
        print(
            "\n%d dumps (%s), %d hang verdicts, load %.1f-%.1f: %s"
            % (N, "CPU burner" if loaded else "quiet", len(hung), min(loads), max(loads), hung[:3])
        )
        assert hung == []
        assert {k[0] for k in kinds} == {"progressing"}
        if loaded and N == 100:  # the "also at load >= 4" (the 4 dumps of CI: printed only)
            assert max(loads) >= 4, "the machine was not loaded (load %.1f-%.1f)" % (min(loads), max(loads))
    finally:
        stop(job, hot)


def test_dump_of_the_hung_variant_names_the_rank_in_the_queue(tmp_path):
    """Rank 2 waits in multiprocessing.Queue.get() at step 30 while ranks 0-1 wait in DDP's
    gradient all-reduce: the dump taken as it hangs names rank 2, also under load."""
    job, out, run = start_job(tmp_path, traced=True, hang_rank=2, hang_step=30)
    hot = burner()
    try:
        wait_file(job, out / "hanging")
        # hung means every process of the job still: ranks 0-1 reach DDP's all-reduce after
        # rank 2 stopped and the DataLoader workers fill their prefetch queues; a window that
        # sees any of them still working rightly says progressing (the CI mimic caught both)
        wait_until(lambda: blocked(descendants(job.pid)), timeout=120, period=0.2)
        d = dump(run, tmp_path, "--window", "2")
        assert d["kind"] == "stuck-outside-collective", d["summary"]
        assert d["culprit_ranks"] == [2], d["summary"]
        assert d["details"]["window"]["advanced_ranks"] == [], d["details"]["window"]
        assert d["details"]["window"]["window_s"] >= 2.0
    finally:
        stop(job, hot)


def attach(pids, tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "hangtrace", "attach", "--json"] + sum([["--pid", str(p)] for p in pids], []),
        env=base_env(traced=False, TMPDIR=tmp_path),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_attach_to_an_untraced_job_hung_in_a_queue_names_the_rank_in_the_headline(tmp_path):
    """Ranks 0-1 wait in DDP's backward (C++ all-reduce: no torch.distributed frame), rank 2
    in multiprocessing.Queue.get(): the headline names rank 2 and Queue.get, under load."""
    job, out, _run = start_job(tmp_path, traced=False, hang_rank=2, hang_step=30)
    hot = burner()
    try:
        wait_file(job, out / "hanging")
        pids = rank_pids(job)
        assert len(pids) == 3
        # ranks 0-1 reach DDP's all-reduce after rank 2 stopped; under load that takes a while,
        # and samples taken while they still work rightly say the job is progressing
        wait_until(lambda: blocked(pids), timeout=120, period=0.2)
        d = attach(pids, tmp_path)
        assert d["kind"] == "stuck-outside-collective", d["summary"]
        assert d["culprit_ranks"] == [2], d["summary"]
        assert d["waiting_ranks"] == [0, 1]
        head = d["summary"].split(". ")[0]
        assert "rank 2" in head and "Queue.get" in head and "ddp_loader_train.py" in head, head
    finally:
        stop(job, hot)


@pytest.mark.timeout(300 + 20 * N)
@LOADED
def test_attach_to_a_healthy_untraced_job_says_progressing(tmp_path, loaded):
    job, out, _run = start_job(tmp_path, traced=False)
    hot = None
    try:
        wait_file(job, out, pred=lambda o: step_of(o) >= 5)
        hot = burner() if loaded else None
        pids = rank_pids(job)
        assert len(pids) == 3
        n = max(3, N // 3)
        kinds = [attach(pids, tmp_path) for _ in range(n)]
        print(
            "\n%d attaches (%s), load %.1f: %s"
            % (
                n,
                "CPU burner" if loaded else "quiet",
                _load(),
                [(d["kind"], d["summary"][:90]) for d in kinds],
            )
        )
        assert [d["kind"] for d in kinds] == ["progressing"] * n
    finally:
        stop(job, hot)
