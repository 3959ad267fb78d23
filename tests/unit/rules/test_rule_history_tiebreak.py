"""Issue 37: on a two-member group, which rank changed is told by each rank's own history
(``analyze/graph/history.py``): the rank whose current collective its loop never issued is
the one that changed, the rank waiting in the collective its every step issued is its
victim. Scenarios measured on 2 ranks, DDP on gloo (2026-12-07): a Lightning callback's
rank-0-only ``barrier()`` against the broadcast Lightning issues every step; a metric
``all_reduce`` on rank 0 against DDP's bucket all-reduce (C++-issued: Flight Recorder
entries); a rank whose data ran out first; and the rare case where history cannot tell."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from synth import R, snap  # noqa: E402
from ruleutil import check  # noqa: E402

from hangtrace.tracer.analyze.diagnose import diagnose  # noqa: E402

FR = "flight-recorder"


def plain(rank):
    """A rank of a framework's loop: no ``tracer.step`` and no phase in its records."""
    return R(rank, 2, phase=None, step=None)


def bucket(b, **kw):
    """DDP's bucket all-reduce: C++-issued, from torch's Flight Recorder only."""
    r = b.coll(**dict(dict(op="all_reduce", dtype="float32", numel=2177), **kw))
    r["source"] = FR
    return r


def lightning(b, steps=20):
    """Set-up barriers, then per step Lightning's SIGTERM-flag broadcast and DDP's buckets."""
    b.coll(op="barrier", numel=0, n=3)
    b.coll(op="all_reduce", dtype="int64", numel=1, n=2)
    for _ in range(steps):
        b.coll(op="broadcast", dtype="int64", numel=1, peer=0)
        bucket(b)


def test_a_callbacks_barrier_on_rank_0_against_the_per_step_broadcast_names_rank_0():
    r0, r1 = plain(0), plain(1)
    for b in (r0, r1):
        lightning(b)
    r0.wait(op="barrier", numel=0)  # ExportCallback: trainer.strategy.barrier() if is_global_zero
    r1.wait(op="broadcast", dtype="int64", numel=1, peer=0)  # the next step's flag
    d = check(diagnose(snap([r0, r1])), "collective-mismatch", [0])
    line = next(e for e in d.evidence if e.startswith("tie broken by each rank's own history"))
    assert "rank 0's barrier" in line and "none of its 20 earlier steps" in line, line
    assert "its last one was seq 3, before that loop" in line, line
    assert "rank 1's broadcast" in line and "each of its 20 earlier steps issued at this place" in line, line
    assert "left its loop" not in line and "naming all" not in " ".join(d.evidence), d.evidence


def test_a_metric_all_reduce_on_rank_0_against_ddps_bucket_all_reduce_names_rank_0():
    r0, r1 = plain(0), plain(1)
    for b in (r0, r1):
        b.coll(op="all_reduce", dtype="float32", numel=1)  # a set-up sync: the size is not new on the group
        for _ in range(12):
            bucket(b)
    r0.wait(op="all_reduce", dtype="float32", numel=1)  # the metric, rank 0 only
    bucket(r1, state="issued")  # the next step's backward
    d = check(diagnose(snap([r0, r1])), "collective-mismatch", [0])
    line = next(e for e in d.evidence if e.startswith("tie broken by each rank's own history"))
    assert "rank 0's all_reduce float32 numel=1" in line and "numel=2177" in line, line
    assert "rank 1 waits in what its loop issues, its victim" in line, line


def test_a_callbacks_barrier_against_the_trainers_logging_gather_of_every_few_steps_names_rank_0():
    """HF Trainer (measured 2026-12-07): per step a token-count all_gather and DDP's two
    bucket all-reduces; every 5 steps two more all_gathers of the logged loss. At step 10
    rank 0's callback barrier meets rank 1's logging gather: not every step issues that
    gather, but its loop did (step 5); the barrier no step ever issued."""
    r0, r1 = plain(0), plain(1)
    for b in (r0, r1):
        for step in range(1, 10):
            b.coll(op="all_gather", dtype="int64", numel=1)
            bucket(b)
            bucket(b, dtype="int32", numel=28)
            if step == 5:
                b.coll(op="all_gather", dtype="float32", numel=1, n=2)
    r0.wait(op="barrier", numel=0)
    r1.wait(op="all_gather", dtype="float32", numel=1)
    d = check(diagnose(snap([r0, r1])), "collective-mismatch", [0])
    assert d.details["changed_by_history"]["status"] == {"0": "new", "1": "recurring"}, d.details
    assert "rank 1 waits in all_gather, the collective its loop issued before" in d.summary, d.summary


def test_a_rank_that_left_its_loop_early_is_named_as_such():
    r0, r1 = R(0, 2), R(1, 2)
    for b in (r0, r1):  # rank 1's shard is one batch shorter: 8 batches, rank 0's 9
        for s in range(1, 9):
            b.mark(step=s)
            b.coll(op="all_reduce", numel=1024)
            b.coll(op="all_reduce", numel=1)
    r0.mark(step=9)
    r0.wait(op="all_reduce", numel=1024)  # step 9's gradient all-reduce
    r1.mark(kind="phase_exit", phase="eval")
    r1.wait(op="all_gather", numel=4)  # the first collective after its loop
    d = check(diagnose(snap([r0, r1])), "collective-mismatch", [1])
    line = next(e for e in d.evidence if e.startswith("tie broken by each rank's own history"))
    assert "rank 1 left its loop early" in line and "phase 'eval' is none of its loop's ('train')" in line, (
        line
    )
    assert "left its loop early" in d.summary, d.summary


def test_when_both_collectives_are_new_to_their_loops_both_are_named_and_why():
    r0, r1 = plain(0), plain(1)
    for b in (r0, r1):
        lightning(b, steps=6)
    r0.wait(op="barrier", numel=0)
    r1.wait(op="all_gather", dtype="float32", numel=4)  # a rank-1-only callback of its own
    d = check(diagnose(snap([r0, r1])), "collective-mismatch", [0, 1])
    line = next(e for e in d.evidence if "history cannot decide" in e)
    assert "each rank's collective is new to its own loop" in line and "naming all" in line, line
    assert "rank 0's barrier" in line and "rank 1's all_gather" in line, line


def test_a_history_too_short_decides_nothing():
    r0, r1 = plain(0), plain(1)
    r0.wait(op="barrier", numel=0)
    r1.wait(op="broadcast", dtype="int64", numel=1, peer=0)
    d = check(diagnose(snap([r0, r1])), "collective-mismatch", [0, 1])
    assert any("a rank's history shows no loop to compare with" in e for e in d.evidence), d.evidence


TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/job/train.py", line 54, in <module>\n'
    "    model(x).sum().backward()\n"
    '  File "/usr/lib/python3.11/site-packages/torch/_tensor.py", line 623, in backward\n'
    "    torch.autograd.backward(\n"
    "RuntimeError: Connection reset by peer\n"
)


def _abort_at_a_call_rank_1_never_made(metric_every_step):
    """Rank 0 alone all-reduces a one-float metric; rank 1 is in DDP's bucket all-reduce (C++:
    no record of ours, no Flight Recorder dump once it is dead). gloo aborts rank 0 (it
    receives 36 floats), rank 1 fails in backward with "Connection reset by peer"."""
    r0, r1 = plain(0), plain(1)
    if metric_every_step:
        for b in (r0, r1):
            b.coll(op="all_reduce", numel=1, n=4)
    r0.wait(op="all_reduce", numel=1)
    p0 = r0.set(
        state="killed", signals={"fatal": {"wall_ns": r0.t + 1000, "text": "Fatal Python error: Aborted\n"}}
    )
    exc = {
        "event": "exception",
        "type": "RuntimeError",
        "wall_ns": r0.t + 50_000_000,
        "message": "Connection reset by peer",
        "traceback": TRACEBACK,
    }
    p1 = r1.set(state="exited", exit_code=1, events=[exc])
    return diagnose(snap([p0.build(), p1.build()], reason="death"))


def test_gloos_size_check_abort_at_a_call_the_peer_never_made_names_the_rank_that_made_it():
    d = check(_abort_at_a_call_rank_1_never_made(False), "collective-mismatch", [0])
    ab = d.details["size_abort"]
    assert (ab["rank"], ab["peers"], ab["call"]) == (0, [1], 1), ab
    assert "no member issued one on the group before; rank 1 never made that call" in ab["how"], ab
    assert "Received data size doesn't match expected size" in d.summary and "Dead rank" not in d.summary
    assert any(
        e.startswith("rank 1 failed in backward (_tensor.py:623) < <module> (train.py:54)")
        for e in d.evidence
    )
    assert [c["rank"] for c in d.cascade] == [1] and "faulthandler" not in d.summary, (d.cascade, d.summary)


def test_gloos_size_check_abort_at_a_call_routine_in_the_loop_names_the_peer_that_skipped_it():
    d = check(_abort_at_a_call_rank_1_never_made(True), "collective-mismatch", [1])
    assert (
        "is routine in its loop" in d.details["size_abort"]["how"]
        and "rank 1 skipped it" in d.details["size_abort"]["how"]
    )
    assert "which is not the rank that changed" in d.summary, d.summary


def accelerate(b):
    """Accelerate + DDP as recorded (2026-12-07, acc_rank0_barrier): set-up barrier, gather,
    broadcasts; DDP's bucket all-reduce per step and `accelerator.gather` of the loss every 5
    steps; the first step's bucket rebuild breaks the rhythm, so the stream repeats its step
    only once before step 10 (no repeating step for the period search)."""
    b.coll(op="barrier", numel=0)
    b.coll(op="all_gather", dtype="float32", numel=1)
    b.coll(op="broadcast", dtype="int64", numel=12, peer=0)
    b.coll(op="broadcast", dtype="float32", numel=4740, peer=0)
    b.coll(op="broadcast", dtype="float32", numel=5056, peer=0)
    bucket(b, numel=4740)
    b.coll(op="broadcast", dtype="int64", numel=5, peer=0)
    b.coll(op="broadcast", dtype="int64", numel=1, peer=0)
    for _ in range(4):
        bucket(b, numel=4740)
    b.coll(op="all_gather", dtype="float32", numel=1)
    for _ in range(5):
        bucket(b, numel=4740)
    b.coll(op="all_gather", dtype="float32", numel=1)


def test_without_a_repeating_step_a_barrier_never_issued_since_the_loop_began_names_rank_0():
    """acc_rank0_barrier: `accelerator.wait_for_everyone()` under `if is_main_process` at step
    10 against rank 1's next bucket all-reduce; the loop's own collective (10 of its 14 since
    it began) against one issued only before the loop (the set-up barrier)."""
    r0, r1 = plain(0), plain(1)
    for b in (r0, r1):
        accelerate(b)
    r0.wait(op="barrier", numel=0)
    bucket(r1, numel=4740, state="issued")
    d = check(diagnose(snap([r0, r1])), "collective-mismatch", [0])
    line = next(e for e in d.evidence if e.startswith("tie broken by each rank's own history"))
    assert "rank 0's barrier" in line and "since its loop began" in line, line
    assert "its last one was seq 1, before that loop" in line, line
    assert "rank 1's all_reduce" in line and "its loop's own collective" in line, line


def test_without_a_repeating_step_a_skipped_step_stays_undecided():
    """acc_skip_step: rank 1 skipped step 10 (its bucket and the gather); at the gather's seq
    rank 0 gathers and rank 1 all-reduces step 11's bucket. Both are collectives their loops
    issue; without steps nothing tells the place: both named, and the line says why."""
    r0, r1 = plain(0), plain(1)
    for b in (r0, r1):
        accelerate(b)
        for _ in range(4):
            bucket(b, numel=4740)
    bucket(r0, numel=4740)
    r0.wait(op="all_gather", dtype="float32", numel=1)
    bucket(r1, numel=4740)
    bucket(r1, numel=4740, state="issued")
    d = diagnose(snap([r0, r1]))
    assert d.kind == "collective-mismatch" and d.culprit_ranks == [0, 1], d.summary
    assert any("history cannot decide" in e for e in d.evidence), d.evidence
