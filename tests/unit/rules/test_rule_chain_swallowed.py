"""A rank stuck outside collectives shortly after one of its asyncio tasks (or threads)
died unseen: the paragraph names that exception as the likely cause (blind helper 80: a
rollout task's KeyError in its reward function, nobody awaited the task; the trainer waits
in ``await queue.get()``, rank 0 in all_reduce)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ruleutil import QUEUE_GET, check  # noqa: E402
from synth import COLL_STACK, S, ranks, snap, stack  # noqa: E402

from hangtrace.tracer.analyze.diagnose import diagnose  # noqa: E402

TB = (
    'Traceback (most recent call last):\n  File "/job/job.py", line 24, in rollout\n    rewards = ...\n'
    '  File "/job/job.py", line 17, in reward_fn\n    return meta["source"]\nKeyError: \'source\'\n'
)


def _hang(event_age_s):
    b = ranks(2, steps=5)
    b[0].wait()
    b[0].set(stacks=stack(*COLL_STACK, active=False))
    ev = {
        "event": "task_exception",
        "coro": "rollout",
        "task": "Task-2",
        "type": "KeyError",
        "message": "'source'",
        "traceback": TB,
        "wall_ns": b[0].t - int(event_age_s * S),
    }
    b[1].set(stacks=stack(*QUEUE_GET, active=False), events=[ev])
    return diagnose(snap(b))


def test_a_task_that_died_unseen_before_the_hang_is_named_in_the_paragraph():
    d = check(_hang(1), "stuck-outside-collective", [1])
    assert d.details["after_exception_source"] == "asyncio-task"
    assert (
        "It stopped after an exception: rank 1's asyncio task 'rollout' raised KeyError: 'source' at reward_fn "
        "(job.py:17) and nobody retrieved it; if it fed what rank 1 waits for, that is why it waits."
    ) in d.summary
    assert "keep a reference to each task you create and await it" in d.summary


def test_a_task_that_died_long_before_the_hang_is_evidence_only():
    d = check(_hang(600), "stuck-outside-collective", [1])
    assert "after_exception" not in d.details
    assert any("raised KeyError: 'source' at reward_fn (job.py:17)" in e for e in d.evidence)


LOOP_IDLE_STACK = (
    "EpollSelector.select /lib/python3.11/selectors.py:468",
    "BaseEventLoop._run_once /lib/python3.11/asyncio/base_events.py:1884",
    "BaseEventLoop.run_forever /lib/python3.11/asyncio/base_events.py:607",
    "BaseEventLoop.run_until_complete /lib/python3.11/asyncio/base_events.py:640",
    "run /lib/python3.11/asyncio/runners.py:118",
    "<module> /job/job.py:71",
)


def test_an_idle_event_loop_is_named_by_its_await_chain_not_its_selector():
    """The culprit's main thread is its asyncio loop waiting in epoll: the reason is the await
    chain (where the program waits), not the selector, and no stack of the loop's own frames."""
    from hangtrace.tracer.snapshot import LoopTasks, PendingTask

    b = ranks(2, steps=5)
    b[0].wait()
    b[0].set(stacks=stack(*COLL_STACK, active=False))
    lp = LoopTasks(
        thread_id=1,
        tasks=(
            PendingTask(
                "Task-1",
                "main",
                (
                    ("main", "/job/job.py", 67),
                    ("trainer", "/job/job.py", 48),
                    ("get", "/lib/python3.11/asyncio/queues.py", 158),
                ),
                awaits_future="<Future pending cb=[Task.task_wakeup()]>",
            ),
        ),
    )
    b[1].set(stacks=stack(*LOOP_IDLE_STACK, active=False), asyncio_loops=(lp,))
    d = check(diagnose(snap(b)), "stuck-outside-collective", [1])
    assert (
        ": its asyncio event loop is idle: task 'Task-1' in get (queues.py:158) "
        "<- trainer (job.py:48) <- main (job.py:67), awaiting <Future pending cb=[Task.task_wakeup()]>."
    ) in d.summary, d.summary
    assert "select" not in d.summary.split("Next:")[0], d.summary


def test_an_exception_raised_in_a_comprehension_is_placed_in_its_function():
    """Blind helper 83: a producer thread died of ValueError inside a list comprehension of
    ``parse_record``; the sentence said "at <listcomp> (...:43)"."""
    b = ranks(2, steps=5)
    b[0].wait()
    b[0].set(stacks=stack(*COLL_STACK, active=False))
    tb = (
        'Traceback (most recent call last):\n  File "/job/train.py", line 50, in tokenizer\n    q.put(...)\n'
        '  File "/job/train.py", line 43, in parse_record\n    return [int(x) for x in rec]\n'
        '  File "/job/train.py", line 43, in <listcomp>\n    return [int(x) for x in rec]\n'
        "ValueError: invalid literal for int() with base 10: 'oops'\n"
    )
    ev = {
        "event": "thread_exception",
        "thread_name": "tokenizer",
        "type": "ValueError",
        "message": "invalid literal for int() with base 10: 'oops'",
        "traceback": tb,
        "wall_ns": b[0].t - S,
    }
    b[1].set(stacks=stack(*QUEUE_GET, active=False), events=[ev])
    d = check(diagnose(snap(b)), "stuck-outside-collective", [1])
    assert (
        "rank 1's thread 'tokenizer' died of ValueError: invalid literal for int() with base 10: 'oops' at "
        "<listcomp> in parse_record (train.py:43)" in d.summary
    ), d.summary
