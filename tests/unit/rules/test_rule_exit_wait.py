"""Rule exit_wait: the job does not exit at the end - a rank's program returned while the
interpreter joins a non-daemon thread that never ends (or an exit handler blocks), the
other ranks exited. A job written from that incident (2026-12-04): the verdict was
"Unknown: nothing progressed but no rank is in a collective"."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ruleutil import check  # noqa: E402
from synth import COLL_STACK, ranks, snap, stack  # noqa: E402

from hangtrace.tracer.analyze.diagnose import diagnose  # noqa: E402

SHUTDOWN = ("_shutdown threading.py:1590",)
UPLOADER = (
    "Condition.wait threading.py:327",
    "Queue.get queue.py:171",
    "uploader /job/train.py:7",
    "Thread.run threading.py:982",
    "Thread._bootstrap threading.py:1002",
)
EXITING = {"event": "exiting", "threads": [{"name": "metrics-uploader", "native_id": 4242}], "more": 0}


def _uploader_stack(main=SHUTDOWN, **kw):
    th = stack(*main, active=False, extra_threads=[("metrics-uploader", UPLOADER)])
    th[1].update(os_thread_id=4242, active=False, kernel={"syscall": "futex", "args": []})
    th[0].update(kernel={"syscall": "futex", "args": []})
    return th


def _job(events=(EXITING,), main=SHUTDOWN, others_exit=True):
    b = ranks(3, steps=5)
    b[0].set(stacks=_uploader_stack(main), stack_source="py-spy", events=list(events))
    if others_exit:
        for x in b[1:]:
            x.set(state="exited", exit_code=0)
    return diagnose(snap(b, reason="stall"))


def test_a_rank_whose_exit_joins_a_thread_that_never_ends_is_named_with_that_thread():
    d = check(_job(), "stuck-outside-collective", [0])
    assert d.cause == "blocked" and d.details["exited_ranks"] == [1, 2]
    text = d.details["exit_wait"]["0"]
    assert text == (
        "its program returned and the interpreter waits at exit (threading._shutdown) for its "
        "non-daemon thread 'metrics-uploader', in uploader (train.py:7): queue.get/put (waiting for "
        "a producer/consumer) in Queue.get (queue.py:171)"
    ), text
    assert d.summary.startswith(
        "Stuck at exit (in no collective), after phase 'train', step 0: rank 0's program returned and "
        "the interpreter waits at exit"
    ), d.summary
    assert "Ranks 1-2 exited cleanly. Next: stop the thread named above" in d.summary, d.summary


def test_the_stack_alone_is_enough_and_then_every_started_thread_is_named():
    """Attach-like: no exiting event (not traced at exit), the main thread in _shutdown."""
    d = check(_job(events=()), "stuck-outside-collective", [0])
    assert "for its thread 'metrics-uploader'" in d.details["exit_wait"]["0"], d.details


def test_an_exit_handler_that_blocks_is_named_with_the_event():
    handler = ("Event.wait threading.py:629", "finish /site-packages/tracker/run.py:88")
    d = check(_job(main=handler), "stuck-outside-collective", [0])
    assert d.details["exit_wait"]["0"].startswith(
        "its program returned and the process is in an exit handler (atexit): thread lock/condition/event wait "
        "in Event.wait (threading.py:629), in Event.wait (threading.py:629) < finish (run.py:88)"
    ), d.details


def test_not_at_exit_without_the_event_or_with_the_program_still_running():
    # an outermost frame that is not <module> without the event: a cut stack, not an exit handler
    handler = ("Event.wait threading.py:629", "finish /site-packages/tracker/run.py:88")
    d = check(_job(events=(), main=handler), "unknown", [])
    assert "exit_wait" not in d.details
    # the event, yet the main thread runs the program (an event inherited by a forked child)
    d = check(
        _job(main=("get queue.py:171", "main /job/train.py:90", "<module> /job/train.py:100")), "unknown", []
    )
    assert "exit_wait" not in d.details


def test_ranks_waiting_in_a_collective_are_a_hang_not_an_exit_verdict():
    b = ranks(2, steps=5)
    b[0].set(stacks=_uploader_stack(), stack_source="py-spy", events=[EXITING])
    b[1].wait("0")
    b[1].set(stacks=stack(*COLL_STACK), stack_source="py-spy")
    d = check(diagnose(snap(b, reason="stall")), "skipped-collective", [0])
    assert "exit_wait" not in d.details
    # rule chain says of the chain end that its program returned, and what its exit waits for
    assert d.details["culprit_reasons"]["0"].startswith(
        "its program returned without entering it, and the interpreter waits at exit (threading._shutdown) for "
        "its non-daemon thread 'metrics-uploader'"
    ), d.details["culprit_reasons"]


def test_a_spawned_childs_exit_is_multiprocessings_bootstrap_calling_shutdown():
    """torch.multiprocessing.spawn: a child's main thread joins its non-daemon threads in
    multiprocessing's BaseProcess._bootstrap, under spawn_main (blind helper 56: 'Unknown')."""
    spawn = (
        "_shutdown threading.py:1590",
        "BaseProcess._bootstrap multiprocessing/process.py:332",
        "_main multiprocessing/spawn.py:133",
        "spawn_main multiprocessing/spawn.py:120",
        "<module> <string>:1",
    )
    d = check(_job(main=spawn), "stuck-outside-collective", [0])
    assert "non-daemon thread 'metrics-uploader', in uploader (train.py:7)" in d.details["exit_wait"]["0"]
    d = check(_job(events=(), main=spawn), "stuck-outside-collective", [0])  # (attach: the stack alone)


def test_concurrent_futures_joining_its_worker_at_exit_names_the_worker_and_its_wait():
    """Blind helper 57: a ThreadPoolExecutor upload that never returns keeps the process alive
    - concurrent.futures' _python_exit (inside threading._shutdown, before any atexit handler)
    joins its workers, daemon threads since 3.9, so the exiting event lists none."""
    main = (
        "Thread._wait_for_tstate_lock threading.py:1139",
        "Thread.join threading.py:1119",
        "_python_exit /usr/lib/python3.11/concurrent/futures/thread.py:31",
        "_shutdown threading.py:1590",
    )
    worker = (
        "socket.recv socket.py:1",
        "StoreClient.put /job/train.py:53",
        "_WorkItem.run /usr/lib/python3.11/concurrent/futures/thread.py:58",
        "_worker /usr/lib/python3.11/concurrent/futures/thread.py:83",
        "Thread.run threading.py:982",
        "Thread._bootstrap threading.py:1002",
    )
    server = (
        "socket.accept socket.py:294",
        "serve /job/train.py:39",
        "Thread.run threading.py:982",
        "Thread._bootstrap threading.py:1002",
    )
    b = ranks(2, steps=5)
    th = stack(*main, active=False, extra_threads=[("ckpt-upload_0", worker), ("fake-store", server)])
    th[1].update(active=False)
    th[2].update(active=False)
    b[0].set(stacks=th, stack_source="py-spy", events=[{"event": "exiting", "threads": [], "more": 0}])
    b[1].set(state="exited", exit_code=0)
    d = check(diagnose(snap(b, reason="stall")), "stuck-outside-collective", [0])
    assert d.details["exit_how"] == "executor"
    text = d.details["exit_wait"]["0"]
    assert text.startswith(
        "its program returned and concurrent.futures' exit hook (_python_exit, run by "
        "threading._shutdown before any atexit handler) joins its ThreadPoolExecutor worker "
        "'ckpt-upload_0', in StoreClient.put (train.py:53): socket IO"
    ), text
    assert "fake-store" not in text  # (not a worker of the pool)
    assert "Next: give the work submitted to the ThreadPoolExecutor a timeout" in d.summary, d.summary


def test_an_exit_handler_names_its_own_line_and_the_threads_it_may_wait_for():
    handler = (
        "Condition.wait threading.py:327",
        "wait /usr/lib/python3.11/concurrent/futures/_base.py:305",
        "_drain_uploads /job/train.py:64",
    )
    d = check(_job(main=handler), "stuck-outside-collective", [0])
    assert d.details["exit_how"] == "handler"
    text = d.details["exit_wait"]["0"]
    assert text.startswith(
        "its program returned and the process is in an exit handler (atexit) _drain_uploads "
        "(train.py:64): waiting for a future in wait (_base.py:305)"
    ), text
    assert "its other thread 'metrics-uploader', in uploader (train.py:7)" in text, text
    assert "Next: give the exit handler's wait a timeout" in d.summary, d.summary
