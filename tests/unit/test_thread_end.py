"""A rank whose collectives came from a thread that has ended (Ray Train's TrainingThread, a
user's worker thread) skipped the collective its peers wait in; its main thread's wait is not
the reason (issue 37, blind job rt_skip_step)."""

import json

import pytest

from synth import R, frames, snap

from hangtrace.tracer.analyze.diagnose import diagnose

LOOP = "TrainingThread(train_fn_with_final_checkpoint_flush)"
MAIN = {
    "thread_name": "MainThread",
    "thread_id": 1,
    "active": False,
    "frames": frames(
        "main_loop /site-packages/ray/_private/worker.py:1069",
        "<module> /site-packages/ray/_private/workers/default_worker.py:323",
    ),
}


def job(threads_of_rank1, ddp=False):
    bs = [R(r, 2, pid=100 + r) for r in (0, 1)]
    for b in bs:
        b.coll(op="all_reduce", numel=64, n=30 if b.rank == 0 else 28)
        for rec in b.records:  # DDP's all-reduces: Flight Recorder entries named after torch's thread
            rec.update(thread="ray::RayTrainWo", source="flight-recorder") if ddp else rec.update(thread=LOOP)
        if ddp:  # Ray Train's report: a ray.get on the sync actor, in the loop's thread
            text = json.dumps(
                {"api": "get", "n": 1, "targets": [{"actor_id": "ab" * 16, "class": "S", "method": "m"}]}
            )
            b._rec("ray_wait", "", text, 1, dtype="", numel=0, state="completed")["thread"] = LOOP
    bs[0].wait(op="all_reduce", numel=64)
    bs[0].records[-1]["thread"] = LOOP
    loop0 = {
        "thread_name": LOOP,
        "thread_id": 2,
        "active": False,
        "frames": frames("all_reduce c10d.py:1", "train_fn train.py:40"),
    }
    bs[0].set(stacks=[MAIN, loop0], stack_source="py-spy")
    bs[1].set(stacks=threads_of_rank1, stack_source="py-spy")
    return snap(bs)


@pytest.mark.parametrize("ddp", [False, True], ids=["python-collectives", "ddp-and-ray-waits"])
def test_the_loop_thread_ended_is_a_skipped_collective(ddp):
    d = diagnose(job([MAIN], ddp))
    assert (d.kind, d.culprit_ranks) == ("skipped-collective", [1]), (d.kind, d.culprit_ranks, d.evidence)
    assert "the thread its loop ran in (%s) has ended" % LOOP in d.details["culprit_reasons"]["1"]


def test_the_loop_thread_alive_and_blocked_is_not():
    loop1 = {
        "thread_name": LOOP,
        "thread_id": 2,
        "active": False,
        "frames": frames("get queue.py:171", "train_fn train.py:33"),
    }
    d = diagnose(job([MAIN, loop1]))
    assert (d.kind, d.culprit_ranks) == ("stuck-outside-collective", [1]), (
        d.kind,
        d.culprit_ranks,
        d.evidence,
    )


def test_a_main_thread_in_the_users_code_is_what_the_rank_waits_in():
    user_main = dict(MAIN, frames=frames("get queue.py:171", "main /job/train.py:90"))
    d = diagnose(job([user_main]))
    assert (d.kind, d.culprit_ranks) == ("stuck-outside-collective", [1]), (
        d.kind,
        d.culprit_ranks,
        d.evidence,
    )
