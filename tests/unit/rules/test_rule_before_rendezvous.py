"""Rule before_rendezvous: no process group was ever created, some ranks are inside
init_process_group, the others blocked before it (blind helper 59: a cache built under a file
lock that rank 0 held while it called init_process_group; the verdict was 'Unknown')."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ruleutil import QUEUE_GET, check  # noqa: E402
from synth import T0, R, S, snap, stack  # noqa: E402

from hangtrace.tracer.analyze.diagnose import diagnose  # noqa: E402

RDZV = (
    "_create_c10d_store /site-packages/torch/distributed/rendezvous.py:199",
    "_env_rendezvous_handler /site-packages/torch/distributed/rendezvous.py:265",
    "init_process_group /site-packages/torch/distributed/distributed_c10d.py:1892",
    "build_cache /job/job.py:34",
    "<module> /job/job.py:60",
)
FILELOCK = (
    "LockAcquisition._poll_until_acquired /site-packages/filelock/_acquire.py:177",
    "LockAcquisition._acquire_level /site-packages/filelock/_acquire.py:104",
    "BaseFileLock.acquire /site-packages/filelock/_lock.py:195",
    "prepare_cache /job/job.py:44",
    "<module> /job/job.py:60",
)


def _rank(r, world, frames, **kw):
    b = R(r, world, groups=[])
    th = stack(*frames, active=False)
    th[0].update(kw)
    return b.set(stacks=th, stack_source="py-spy", progress_wall_ns=0)


def test_a_rank_blocked_before_the_rendezvous_is_named_and_the_ranks_inside_wait_for_it():
    """One rank inside init_process_group, the other blocked on a queue before it (was
    'unknown' with the general cause)."""
    procs = [_rank(0, 2, RDZV), _rank(1, 2, QUEUE_GET)]
    d = check(diagnose(snap(procs, reason="stall", taken=T0 + 120 * S)), "stuck-outside-collective", [1])
    assert d.waiting_ranks == [0] and d.details["rendezvous_ranks"] == [0]
    assert d.details["culprit_reasons"]["1"].startswith("it never reached init_process_group: queue.get/put")
    assert "Rank 0 waits for it in init_process_group (the rendezvous)." in d.summary, d.summary
    assert "Next: find what the named ranks wait for before init_process_group" in d.summary, d.summary


def test_the_rank_inside_holding_the_file_lock_the_others_wait_for_is_a_cycle():
    procs = [_rank(0, 4, RDZV, held_locks=["/data/cache/tokenized.lock"])] + [
        _rank(r, 4, FILELOCK) for r in range(1, 4)
    ]
    d = check(
        diagnose(snap(procs, reason="stall", taken=T0 + 120 * S)), "stuck-outside-collective", [1, 2, 3]
    )
    assert "file lock (the filelock package: polling)" in d.details["culprit_reasons"]["1"]
    assert d.details["rendezvous_lock"].startswith(
        "rank 0 holds a file lock on /data/cache/tokenized.lock while it waits in the rendezvous"
    ), d.details
    assert (
        "ranks 1-3 are not in any collective" in d.summary
        and "Rank 0 waits for them in init_process_group" in d.summary
    ), d.summary
    assert "Next: call init_process_group on every rank before taking a lock" in d.summary, d.summary


def test_every_rank_inside_the_rendezvous_is_not_this_rule():
    procs = [_rank(r, 2, RDZV) for r in range(2)]
    d = check(diagnose(snap(procs, reason="stall", taken=T0 + 120 * S)), "unknown", [])
    assert d.cause == "stalled-in-rendezvous"
