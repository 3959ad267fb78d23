"""A rank blocked on a lock, and the other threads of its process blocked on locks: a real
process in a lock-order deadlock between two threads, its stacks taken by py-spy (the
source line of each blocked frame, the kernel's futex), read by the analysis."""

import os
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from hangtrace.tracer.analyze.stuck.blocking import blocking_reason  # noqa: E402
from hangtrace.tracer.analyze.stuck.lockwait import lock_wait_text  # noqa: E402
from hangtrace.tracer.analyze.stuck.stacktree import pick_thread  # noqa: E402
from hangtrace.tracer.collect import stacks as S  # noqa: E402
from hangtrace.tracer.snapshot import ProcessInfo  # noqa: E402

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")

DEADLOCK = """\
import queue, threading, time
a, b = threading.Lock(), threading.Lock()
idle = queue.Queue()
def other():
    with b:
        time.sleep(0.3)
        with a:
            pass
threading.Thread(target=idle.get, name='idle-consumer', daemon=True).start()
with a:
    threading.Thread(target=other, name='uploader', daemon=True).start()
    time.sleep(0.3)
    with b:
        pass
"""


def _proc(pid, threads):
    return ProcessInfo(
        host="h",
        pid=pid,
        rank=1,
        local_rank=1,
        world_size=2,
        state="alive",
        stacks=threads,
        stack_source="py-spy",
    )


def test_two_threads_in_a_lock_order_deadlock_are_named_with_their_lines(tmp_path):
    if not S.pyspy_path():
        pytest.skip("py-spy not installed")
    job = tmp_path / "job.py"
    job.write_text(DEADLOCK)
    p = subprocess.Popen([sys.executable, str(job)])
    try:
        time.sleep(1.5)
        r = S.dump_one(p.pid)
        threads = r["threads"]
        assert threads, r
        main = pick_thread(threads)
        frames = [f for f in main["frames"] if not f.get("native")]
        why = blocking_reason(frames, thread=main)
        # where each waits, and what it holds: the `with` blocks it is inside (blind helper 53)
        assert (
            why == "waiting for a lock at <module> (job.py:13): `with b:` (inside `with a:` at job.py:10)"
        ), why
        text = lock_wait_text(_proc(p.pid, threads), "rank 1")
        assert (
            text is not None
            and "thread 'uploader' at other (job.py:7): `with a:` (inside `with b:` at job.py:5)" in text
        ), text
        assert "idle-consumer" not in text and "QueueFeeder" not in text, text  # idle waits are no locks
        assert "lock-order deadlock" in text
    finally:
        p.kill()
        p.wait()


def test_no_other_thread_on_a_lock_means_no_sentence():
    fr = [{"name": "main", "filename": "/j/job.py", "line": 33, "code": "with upload_lock:"}]
    main = {
        "thread_name": "MainThread",
        "active": False,
        "frames": fr,
        "kernel": {"syscall": "futex", "args": []},
    }
    cond = {
        "thread_name": "worker",
        "active": False,
        "kernel": {"syscall": "futex", "args": []},
        "frames": [
            {
                "name": "Condition.wait",
                "filename": "/usr/lib/python3.11/threading.py",
                "line": 327,
                "code": "waiter.acquire()",
            },
            {"name": "run", "filename": "/j/job.py", "line": 9},
        ],
    }
    assert blocking_reason(fr, thread=main).startswith("waiting for a lock")
    assert blocking_reason(cond["frames"], thread=cond).startswith("thread lock/condition/event wait")
    assert lock_wait_text(_proc(1, [main, cond]), "rank 1") is None
    # the same line without the kernel's futex (no permission to read it): not called a lock
    assert not blocking_reason(fr, thread=dict(main, kernel=None)).startswith("waiting for a lock")


def test_attach_names_the_other_thread_on_a_lock_too():
    """The stack-only verdict (``hangtrace attach``) says the same."""
    from synth import COLL_STACK, T0, stack
    from hangtrace.tracer.analyze.diagnose import diagnose
    from hangtrace.tracer.snapshot import Snapshot

    fr = [
        {"name": "main", "filename": "/j/job.py", "line": 33, "code": "with upload_lock:"},
        {"name": "<module>", "filename": "/j/job.py", "line": 39},
    ]
    main = {
        "thread_name": "MainThread",
        "active": False,
        "frames": fr,
        "kernel": {"syscall": "futex", "args": []},
    }
    up = {
        "thread_name": "ckpt-uploader",
        "active": False,
        "kernel": {"syscall": "futex", "args": []},
        "frames": [{"name": "uploader", "filename": "/j/job.py", "line": 15, "code": "with state_lock:"}],
    }
    procs = [
        ProcessInfo(
            host="h0",
            pid=2000,
            rank=0,
            local_rank=0,
            world_size=2,
            state="alive",
            stacks=stack(*COLL_STACK),
            stack_source="py-spy",
            meta={"attached": True},
        ),
        ProcessInfo(
            host="h0",
            pid=2001,
            rank=1,
            local_rank=1,
            world_size=2,
            state="alive",
            stacks=[main, up],
            stack_source="py-spy",
            meta={"attached": True},
        ),
    ]
    d = diagnose(Snapshot(run_dir="/tmp/attach", taken_wall_ns=T0, reason="attach", processes=procs))
    assert (d.kind, d.culprit_ranks) == ("stuck-outside-collective", [1]), d.summary
    assert (
        "Rank 1's thread 'ckpt-uploader' at uploader (job.py:15): `with state_lock:` waits for a lock too"
        in d.summary
    ), d.summary
    assert "Next: make the threads named above take their locks in one order" in d.summary, d.summary


def test_the_with_blocks_a_line_is_inside_are_found_by_indentation(tmp_path):
    from hangtrace.tracer.collect.sourcelines import enclosing_blocks

    src = tmp_path / "m.py"
    src.write_text(
        "import threading\n"
        "class C:\n"
        "    def f(self):\n"
        "        with self.a:\n"
        "            if True:\n"
        "                # a comment at a lower indentation is skipped\n"
        "                with tracer.phase('x'):\n"
        "                    with self.b:\n"
        "                        pass\n"
    )
    assert enclosing_blocks(str(src), 9)[0] == [
        [8, "with self.b:"],
        [4, "with self.a:"],
    ]  # (our phases left out)
    assert enclosing_blocks(str(src), 8)[0] == [[4, "with self.a:"]]
    assert enclosing_blocks(str(src), 4)[0] == []  # the def ends the search
    assert enclosing_blocks(str(tmp_path / "gone.py"), 4)[0] == []
