"""Which rank changed, when ranks posted different signatures at one collective
(``analyze/graph/sigclasses.py``): the minority, else the one signature new on the group, and
the rank gloo aborted only when neither decides. Scenarios from blind jobs of 2026-12-02
(an MoE rank padding its expert counts to 10 where its peers have 8; an eval metric
all-reduced as float64 on one rank where every earlier step used float32): gloo aborted
the rank that had NOT changed, and the verdict used to name it."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from synth import MS, R, snap  # noqa: E402

from hangtrace.tracer.analyze.diagnose import diagnose  # noqa: E402

ABORT = {"fatal": {"wall_ns": 0, "text": "Fatal Python error: Aborted\n"}}


def aborted(b):
    return b.set(state="killed", signals={"fatal": dict(ABORT["fatal"], wall_ns=b.t + MS)})


def reset(b, t):
    return b.set(
        state="exited",
        exit_code=1,
        events=[
            {
                "event": "exception",
                "type": "RuntimeError",
                "wall_ns": t,
                "message": "Connection reset by peer",
            }
        ],
    )


def test_gloo_aborted_a_rank_of_the_majority_the_minority_is_named():
    rs = [R(r, 3) for r in range(3)]
    for b in rs:
        b.coll(op="all_gather_into_tensor", numel=24, n=3)
    rs[0].coll(op="all_gather_into_tensor", numel=24, state="issued")
    rs[1].coll(op="all_gather_into_tensor", numel=24, state="failed", error="Connection reset by peer")
    rs[2].coll(op="all_gather_into_tensor", numel=30, state="failed", error="Connection reset by peer")
    ps = [
        aborted(rs[0]).build(),
        reset(rs[1], rs[1].t + 50 * MS).build(),
        reset(rs[2], rs[2].t + 50 * MS).build(),
    ]
    d = diagnose(snap(ps, reason="death"))
    assert (d.kind, d.cause, d.culprit_ranks) == ("collective-mismatch", "mismatch", [2]), d.summary
    assert sorted((s["numel"], s["ranks"]) for s in d.details["signatures"]) == [(24, [0, 1]), (30, [2])]


def test_two_ranks_the_one_whose_dtype_is_new_on_the_group_is_named_not_the_aborted_one():
    r0, r1 = R(0, 2), R(1, 2)
    for s in range(1, 6):
        for b in (r0, r1):
            b.mark(step=s)
            b.coll(numel=1024, n=4)  # gradient buckets
            b.coll(numel=1)  # the metric, float32
    r0.mark(step=6)
    r1.mark(step=6)
    r0.coll(numel=1, state="issued")
    r1.coll(numel=1, dtype="float64", state="failed", error="Connection reset by peer")
    d = diagnose(snap([aborted(r0).build(), reset(r1, r1.t + 50 * MS).build()], reason="death"))
    assert (d.kind, d.culprit_ranks, d.seq) == ("collective-mismatch", [1], 26), (d.summary, d.evidence)
    line = next(e for e in d.evidence if "for the first time" in e)
    assert "rank 1 posted all_reduce float64 numel=1" in line and "seq 5, 10, 15, 20, 25" in line, line
    assert {s["dtype"]: s["ranks"] for s in d.details["signatures"]} == {"float64": [1], "float32": [0]}


def test_a_hang_tie_broken_by_the_new_dtype():
    r0, r1 = R(0, 2), R(1, 2)
    for b in (r0, r1):
        b.coll(numel=1, n=5)
    r0.wait(numel=1, dtype="bfloat16")
    r1.wait(numel=1)
    d = diagnose(snap([r0.build(), r1.build()]))
    assert (d.kind, d.culprit_ranks) == ("collective-mismatch", [0]), d.summary
    assert any(e.startswith("tie broken: rank 0 posted all_reduce bfloat16") for e in d.evidence), d.evidence


def test_a_new_op_is_not_novelty_and_no_history_falls_back():
    # different ops are not compared by novelty; each rank's own history (issue 37) names the
    # rank whose barrier its loop of all_reduces never issued
    r0, r1 = R(0, 2), R(1, 2)
    for b in (r0, r1):
        b.coll(numel=1, n=5)
    r0.wait(op="barrier")
    r1.wait(numel=1)
    d = diagnose(snap([r0.build(), r1.build()]))
    assert d.culprit_ranks == [0] and not any("first time" in e for e in d.evidence), d.evidence
    assert any(e.startswith("tie broken by each rank's own history: rank 0's barrier") for e in d.evidence)
    # no earlier record of either signature: the aborted rank, as before (issue 9)
    r0, r1 = R(0, 2), R(1, 2)
    r0.coll(op="broadcast", numel=4, peer=0, state="failed", error="Connection closed by peer")
    r1.coll(op="broadcast", numel=1024, peer=0, state="issued")
    d = diagnose(snap([reset(r0, r0.t + 50 * MS).build(), aborted(r1).build()], reason="death"))
    assert d.culprit_ranks == [1] and any("gloo aborts the rank" in e for e in d.evidence), d.evidence


def test_an_abort_mismatch_is_placed_at_the_culprits_call_not_its_current_phase():
    """The blind Ray job of 2026-12-02 (4 actors): rank 2 all_reduced float64 metrics in
    phase 'metrics' of step 5, gloo aborted rank 1 and Ray's shutdown SIGTERMed the rest;
    by the collection rank 2's current phase read 'train_step' (the actor method)."""
    rs = [R(r, 4) for r in range(4)]
    for b in rs:
        b.mark(phase="metrics", step=5)
        b.coll(numel=8, n=2)
        b.coll(numel=8, dtype="float64" if b.rank == 2 else "float32", state="issued")
    rs[2].set(phase="train_step", step=6)
    ps = [aborted(rs[1]).build()] + [
        rs[r]
        .set(
            state="killed",
            signals={
                "sigterm": {
                    "wall_ns": rs[r].t + 200 * MS,
                    "text": "Current thread 0x1 (most recent call first):\n",
                }
            },
        )
        .build()
        for r in (0, 2, 3)
    ]
    d = diagnose(snap(ps, reason="death"))
    assert (d.kind, d.culprit_ranks) == ("collective-mismatch", [2]) and "cause_text" in d.details, d.summary
    assert (d.phase, d.step) == ("metrics", 5) and "train_step" not in d.summary, (d.phase, d.step, d.summary)


def test_a_culprit_back_in_rays_task_loop_is_said_to_be_idle_there_not_given_its_frames():
    """The blind Ray job again: by the collection the culprit actor had returned to Ray's
    worker loop; "it is in main_loop (worker.py:1069) < <module> (default_worker.py:323)"
    told the user nothing. For a culprit whose innermost frame is that loop the paragraph
    says its stack shows it back in Ray's task loop, idle (it may be dead by then: no
    "is now"); a culprit in its own code keeps its frames."""
    from synth import stack

    idle = (
        "main_loop /site-packages/ray/_private/worker.py:1069",
        "<module> /site-packages/ray/_private/workers/default_worker.py:323",
    )
    for frames, expect in (
        (idle, "its stack shows it back in Ray's task loop, idle"),
        (("step train.py:12", "main train.py:40"), "it is in main (train.py:40) > step (train.py:12)"),
    ):
        rs = [R(r, 4) for r in range(4)]
        for b in rs:
            b.mark(phase="metrics", step=5)
            b.coll(numel=8, n=2)
            b.coll(numel=8, dtype="float64" if b.rank == 2 else "float32", state="issued")
        ps = [aborted(rs[1]).build()] + [
            rs[r]
            .set(
                state="killed",
                stacks=stack(*frames),
                signals={
                    "sigterm": {
                        "wall_ns": rs[r].t + 200 * MS,
                        "text": "Current thread 0x1 (most recent call first):\n",
                    }
                },
            )
            .build()
            for r in (0, 2, 3)
        ]
        d = diagnose(snap(ps, reason="death"))
        assert d.culprit_ranks == [2] and expect in d.summary, d.summary
        assert ("main_loop" in d.summary) is False, d.summary
