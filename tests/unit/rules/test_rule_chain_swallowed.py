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

TB = ("Traceback (most recent call last):\n  File \"/job/job.py\", line 24, in rollout\n    rewards = ...\n"
      "  File \"/job/job.py\", line 17, in reward_fn\n    return meta[\"source\"]\nKeyError: 'source'\n")


def _hang(event_age_s):
    b = ranks(2, steps=5)
    b[0].wait()
    b[0].set(stacks=stack(*COLL_STACK, active=False))
    ev = {"event": "task_exception", "coro": "rollout", "task": "Task-2", "type": "KeyError", "message": "'source'",
          "traceback": TB, "wall_ns": b[0].t - int(event_age_s * S)}
    b[1].set(stacks=stack(*QUEUE_GET, active=False), events=[ev])
    return diagnose(snap(b))


def test_a_task_that_died_unseen_before_the_hang_is_named_in_the_paragraph():
    d = check(_hang(1), "stuck-outside-collective", [1])
    assert d.details["after_exception_source"] == "asyncio-task"
    assert ("It stopped after an exception: rank 1's asyncio task 'rollout' raised KeyError: 'source' at reward_fn "
            "(job.py:17) and nobody retrieved it; if it fed what rank 1 waits for, that is why it waits.") in d.summary
    assert "keep a reference to each task you create and await it" in d.summary


def test_a_task_that_died_long_before_the_hang_is_evidence_only():
    d = check(_hang(600), "stuck-outside-collective", [1])
    assert "after_exception" not in d.details
    assert any("raised KeyError: 'source' at reward_fn (job.py:17)" in e for e in d.evidence)
