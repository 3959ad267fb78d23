"""stacktree: STAT-like merge of every rank's main-thread stack into classes."""

import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

from synth import COLL_STACK, R, stack  # noqa: E402

from hangtrace.tracer.analyze.stuck.blocking import blocking_reason, collective_frame  # noqa: E402
from hangtrace.tracer.analyze.stuck.stacktree import (
    NO_STACK,
    classes,
    format_ranks,
    frame_label,
    merge_stacks,
    missing_from_common_frame,
    outliers,
    pick_thread,
    process_frames,
)  # noqa: E402

QUEUE = (
    "get queue.py:171",
    "next_batch loader.py:22",
    "train_step train.py:38",
    "main train.py:90",
    "<module> train.py:100",
)


def procs_with(stacks):
    out = []
    for r, st in enumerate(stacks):
        out.append(dataclasses.replace(R(r, len(stacks)).build(), stacks=st))
    return out


def test_format_ranks():
    assert format_ranks([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"
    assert format_ranks([]) == "none"
    assert format_ranks(range(0, 20, 2), limit=3) == "0,2,4,... (10 ranks)"


def test_classes_outliers_and_missing():
    sts = [stack(*COLL_STACK) for _ in range(9)] + [stack(*QUEUE)]
    tree = merge_stacks(procs_with(sts))
    cl = classes(tree)
    assert [c["count"] for c in cl] == [9, 1]
    assert cl[0]["ranks"] == list(range(9)) and cl[1]["ranks"] == [9]
    # outer -> inner
    assert cl[1]["frames"][0] == "<module> (train.py:100)" and cl[1]["frames"][-1] == "get (queue.py:171)"
    # train_step stands at lines 40 and 38: merged node drops the line
    assert "train_step (train.py)" in cl[1]["frames"]
    assert [c["ranks"] for c in outliers(cl)] == [[9]]
    assert cl[1]["outlier"] and not cl[0]["outlier"]
    miss = missing_from_common_frame(tree)
    assert miss["missing"] == [9] and miss["ranks_in"] == 9
    assert miss["frames"][-1] == "all_reduce (distributed_c10d.py:2500)"


def test_all_equal_no_missing_no_outlier():
    tree = merge_stacks(procs_with([stack(*COLL_STACK) for _ in range(4)]))
    cl = classes(tree)
    assert len(cl) == 1 and cl[0]["count"] == 4 and not outliers(cl)
    assert missing_from_common_frame(tree) is None


def test_key_line_splits_lines():
    sts = [
        stack(*COLL_STACK),
        stack("all_reduce /x/torch/distributed/distributed_c10d.py:2501", *COLL_STACK[1:]),
    ]
    assert len(classes(merge_stacks(procs_with(sts)))) == 1
    assert len(classes(merge_stacks(procs_with(sts), key="line"))) == 2


def test_no_stack_class_and_unranked_skipped():
    ps = procs_with([stack(*COLL_STACK), None, stack(*COLL_STACK)])
    drv = dataclasses.replace(R(-1, 3).build(), stacks=stack(*QUEUE))
    cl = classes(merge_stacks(ps + [drv]))
    assert cl[-1]["frames"] == [NO_STACK] and cl[-1]["ranks"] == [1]
    assert cl[0]["ranks"] == [0, 2]


def test_pick_thread_ignores_hangtrace_threads():
    threads = [
        {
            "thread_name": "hangtrace-watch",
            "active": True,
            "frames": [{"name": "x", "filename": "a.py", "line": 1}],
        },
        {
            "thread_name": "Thread-1",
            "active": False,
            "frames": [{"name": "y", "filename": "b.py", "line": 2}],
        },
        {"thread_name": "worker", "active": True, "frames": [{"name": "z", "filename": "c.py", "line": 3}]},
    ]
    assert pick_thread(threads)["thread_name"] == "worker"
    threads.append({"thread_name": "MainThread", "active": False, "frames": []})
    assert pick_thread(threads)["thread_name"] == "MainThread"
    assert pick_thread([threads[0]]) is None


def test_faulthandler_text_fallback():
    p = dataclasses.replace(
        R(0, 1).build(),
        signals={
            "sigterm": {
                "wall_ns": 1,
                "text": (
                    "Current thread 0x00007f0000000001 (most recent call first):\n"
                    '  File "/usr/lib/python3.11/queue.py", line 171 in get\n'
                    '  File "/app/train.py", line 38 in train_step\n'
                    '  File "/app/train.py", line 100 in <module>\n'
                ),
            }
        },
    )
    frames, _t = process_frames(p)
    assert frames and frame_label(frames[0]) == "get (queue.py:171)"
    assert blocking_reason(frames).startswith("queue.get")


def test_blocking_and_collective_frames():
    from synth import frames

    assert collective_frame(frames(*COLL_STACK)) == "all_reduce (distributed_c10d.py:2500)"
    assert blocking_reason(frames(*COLL_STACK[2:])) is None
    assert blocking_reason(frames(*COLL_STACK[2:]), active=False).startswith("idle")
    assert "lock" in blocking_reason(frames("acquire threading.py:300", "f x.py:1"))
    assert blocking_reason(frames("sleep x.py:5"))


def test_pick_thread_prefers_the_thread_running_user_code_over_an_idle_framework_main():
    """Ray Train V2: the actor's main thread idles in Ray's loop (``epoll_wait in
    Worker.main_loop``) while ``train_func`` runs in a ``TrainingThread``: the rank's verdict
    describes the training thread (``process_frames`` of a Ray actor). A main thread with the
    user's frames stays the one."""
    ray_loop = [
        {
            "name": "main_loop",
            "filename": "/usr/lib/python3.11/site-packages/ray/_private/worker.py",
            "line": 946,
        },
        {
            "name": "<module>",
            "filename": "/usr/lib/python3.11/site-packages/ray/_private/workers/default_worker.py",
            "line": 3,
        },
    ]
    train = [
        {"name": "get", "filename": "/usr/lib/python3.11/queue.py", "line": 171},
        {"name": "train_loop_per_worker", "filename": "/home/u/rt_stuck_queue.py", "line": 88},
        {
            "name": "_run_target",
            "filename": "/usr/lib/python3.11/site-packages/ray/train/v2/x/thread_runner.py",
            "line": 40,
        },
    ]
    threads = [
        {"thread_name": "MainThread", "active": False, "frames": ray_loop},
        {"thread_name": "MonitoringThread(f)", "active": False, "frames": ray_loop[:1]},
        {"thread_name": "TrainingThread(f)", "active": False, "frames": train},
    ]
    assert pick_thread(threads, prefer_user=True)["thread_name"] == "TrainingThread(f)"
    assert pick_thread(threads)["thread_name"] == "MainThread"  # not a Ray actor: as before
    threads[0] = {"thread_name": "MainThread", "active": False, "frames": train[1:]}
    assert pick_thread(threads, prefer_user=True)["thread_name"] == "MainThread"
