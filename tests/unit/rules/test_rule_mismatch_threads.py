"""A background thread and the main thread of one rank issue collectives on one group
(blind helper 67: a 'metrics-sync' thread all-reduces 8 floats every 0.5 s on the default
group while the main thread all-reduces the loss; the ranks pair the two at one seq)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ruleutil import check  # noqa: E402
from synth import COLL_STACK, ranks, snap, stack  # noqa: E402

from hangtrace.tracer.analyze.diagnose import diagnose  # noqa: E402


def _job(metrics_thread_stack=True):
    b = ranks(2, steps=5)
    for r in (0, 1):
        b[r].coll(numel=8)["thread"] = "metrics-sync"  # the thread's earlier calls, same order on both ranks
        b[r].coll()
    b[0].wait(numel=8)["thread"] = "metrics-sync"  # rank 0's thread went first this time
    b[1].wait(numel=1)  # rank 1's main thread did
    main = stack(*COLL_STACK, active=False)
    if metrics_thread_stack:
        sync = (
            "all_reduce /site-packages/torch/distributed/distributed_c10d.py:2500",
            "sync_loop /job/job.py:79",
            "Thread.run threading.py:982",
        )
        main = stack(*COLL_STACK, active=False, extra_threads=[("metrics-sync", sync)])
    b[0].set(stacks=main, stack_source="py-spy")
    b[1].set(stacks=stack(*COLL_STACK, active=False), stack_source="py-spy")
    return diagnose(snap(b, reason="stall"))


def test_a_mismatch_issued_by_a_background_thread_names_the_thread_and_its_frames():
    d = check(_job(), "collective-mismatch", [0, 1])  # (a race: no rank changed, both are named)
    g = d.details["group_threads"]
    assert (g["rank"], g["threads"], g["thread"]) == (0, ["MainThread", "metrics-sync"], "metrics-sync")
    assert (
        "from 2 threads (its main thread, 'metrics-sync'); this all_reduce came from its thread 'metrics-sync'"
        in d.summary
    ), d.summary
    assert d.frames[:2] == ["all_reduce (distributed_c10d.py:2500)", "sync_loop (job.py:79)"], d.frames
    assert "Next: issue each process group's collectives from one thread" in d.summary


def test_without_a_stack_of_that_thread_no_other_threads_frames_are_shown():
    d = check(_job(metrics_thread_stack=False), "collective-mismatch", [0, 1])
    assert d.frames == [] and "train_step" not in d.summary, d.summary
