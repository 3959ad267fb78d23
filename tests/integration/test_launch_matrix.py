"""Issue 9, the launch matrix: faults of examples/train_faults.py under the launchers users
use, with the parts real jobs have - torchrun with DataLoader workers (forked, inheriting
RANK), ``torch.multiprocessing.spawn`` and plain ``multiprocessing.Process`` whose parent
sets RANK/WORLD_SIZE/MASTER_* in its own environment (so the resource tracker and every
helper inherit them). The FIRST verdict of the run (the one the user saw) must name the
right kind, rank and cause; later incidents of the same run (the launcher tearing the
job down) must not contradict it.
"""

import json
import shutil

import pytest

from test_examples import EXAMPLE, run_example
from jobs import long_only

LOADER = ("--loader-workers", "2")
#: DataLoader workers import torch before the first batch: more than 8 s on two busy cores
LOADER_STALL_S = 20
TORCHRUN = shutil.which("torchrun")


def first_verdict(r):
    ds = r.diagnoses()
    assert ds, r.why()
    return ds[0]


def check(r, kind, culprits, cause=None):
    d = first_verdict(r)
    assert (d["kind"], d["culprit_ranks"]) == (kind, culprits), "%s\n%s\n%s" % (
        d["kind"],
        d["summary"],
        r.why(),
    )
    if cause is not None:
        assert d["cause"] == cause, d["summary"]
    for later in r.diagnoses()[1:]:
        if later["kind"] not in ("progressing",):
            assert later["culprit_ranks"] == culprits, later["summary"]
    return d


def run_torchrun(tmp_path, fault, nproc, extra=()):
    if TORCHRUN is None:
        pytest.skip("torchrun not on PATH")
    # run_example's command with torchrun in place of the example's own launcher
    return run_example(
        tmp_path,
        fault,
        extra=list(extra),
        stall_s=LOADER_STALL_S if LOADER[0] in extra else 8,
        launcher_cmd=[TORCHRUN, "--standalone", "--nproc-per-node", str(nproc), EXAMPLE],
    )


# --- torchrun + DataLoader workers ------------------------------------------------------------


@long_only(
    "CI time: test_entry_points' default case runs the queue hang under torchrun with DDP and DataLoader "
    "workers (HANGTRACE=1, dump, analyze), test_examples.test_stuck_queue under hangtrace run"
)
def test_torchrun_loader_stuck_queue(tmp_path):
    r = run_torchrun(tmp_path, "stuck-queue", 2, LOADER)
    d = check(r, "stuck-outside-collective", [1])
    assert any("Queue.get" in f for f in d["frames"][:3]), d["frames"]


def test_torchrun_loader_raise(tmp_path):
    r = run_torchrun(tmp_path, "raise", 2, LOADER)
    d = check(r, "dead-rank", [1], "exception")
    assert "ValueError: bad batch shape" in d["details"]["cause_text"]


def test_torchrun_loader_kill_rank(tmp_path):
    r = run_torchrun(tmp_path, "kill-rank", 2, LOADER)
    check(r, "dead-rank", [1], "killed-without-record")


# --- torch.multiprocessing.spawn, RANK set in the parent ---------------------------------------


def test_spawn_cuda_oom(tmp_path):
    r = run_example(tmp_path, "cuda-oom", extra=("--launcher", "spawn"))
    d = check(r, "dead-rank", [1], "cuda-oom")
    assert "CUDA out of memory" in d["details"]["cause_text"]


def test_spawn_kill_rank(tmp_path):
    r = run_example(tmp_path, "kill-rank", extra=("--launcher", "spawn"))
    check(r, "dead-rank", [1], "killed-without-record")


@long_only("test_examples.test_rank0_checkpoint runs the fault under torchrun")
def test_spawn_rank0_checkpoint(tmp_path):
    # world size 4: with 2 ranks, one all_reduce against one all_gather is a tie (both named)
    r = run_example(tmp_path, "rank0-checkpoint", 4, extra=("--launcher", "spawn"))
    check(r, "collective-mismatch", [0])


# --- multiprocessing.Process (spawn context), RANK set in the parent --------------------------


def test_mp_raise(tmp_path):
    r = run_example(tmp_path, "raise", extra=("--launcher", "mp"))
    d = check(r, "dead-rank", [1], "exception")
    assert "ValueError: bad batch shape" in d["details"]["cause_text"]


@long_only("test_entry_points' default case runs the fault with DataLoader workers")
def test_mp_loader_stuck_queue(tmp_path):
    r = run_example(tmp_path, "stuck-queue", extra=("--launcher", "mp") + LOADER, stall_s=LOADER_STALL_S)
    check(r, "stuck-outside-collective", [1])


def test_mp_cp_extra_microbatch(tmp_path):
    r = run_example(tmp_path, "cp-extra-microbatch", 4, extra=("--launcher", "mp"))
    d = check(r, "skipped-collective", [1], "extra-collective")
    assert json.dumps(d["details"]["extra_collective"])
