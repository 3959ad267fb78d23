"""Issue 9: ties between two ranks broken by what the flight record shows (a survived
exception, the loop's per-step collective count), and a gloo size-mismatch abort named
as the mismatch it is. Scenarios modelled on the blind jobs: torchtitan's teardown
barrier after an exception, a data-dependent loop that ran once more, verl #6365."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from synth import MS, R, snap  # noqa: E402

from hangtrace.tracer.analyze.diagnose import diagnose  # noqa: E402


def steps(b, n_steps, per_step, start=1):
    for s in range(start, start + n_steps):
        b.mark(step=s)
        b.coll(n=per_step)


def test_tie_broken_by_the_exception_that_sent_a_rank_to_its_teardown():
    r0, r1 = R(0, 2), R(1, 2)
    for b in (r0, r1):
        steps(b, 2, 2)
        b.mark(step=3)
        b.coll(n=1)
    r0.wait(op="all_reduce")  # training all_reduce of step 3
    r1.mark("phase_exit")  # AssertionError unwinds phase 'train'
    rec = r1.records[-1]
    rec.update(kind="phase_exit", state="failed", error="AssertionError: lr scheduler step 2 != 3")
    r1.mark(phase="teardown", kind="phase_enter")
    r1.wait(op="barrier")  # the finally block's barrier
    d = diagnose(snap([r0, r1]))
    assert (d.kind, d.culprit_ranks) == ("collective-mismatch", [1]), d.summary
    assert any("tie broken" in e and "AssertionError: lr scheduler step 2 != 3" in e for e in d.evidence), (
        d.evidence
    )


def test_tie_broken_by_the_per_step_count():
    # rank 0's data-dependent loop ran once more in step 4; rank 1 went on to step 5
    r0, r1 = R(0, 2), R(1, 2)
    for b in (r0, r1):
        steps(b, 3, 3)
    r0.mark(step=4)
    r0.coll(n=3)
    r0.wait(op="all_reduce")
    r1.mark(step=4)
    r1.coll(n=3)
    r1.mark(step=5)
    r1.wait(op="all_gather")
    d = diagnose(snap([r0, r1]))
    assert (d.kind, d.culprit_ranks) == ("collective-mismatch", [0]), d.summary
    assert any("per-step collective count" in e and "rank 0 issued one more" in e for e in d.evidence), (
        d.evidence
    )


def test_tie_without_facts_names_both():
    r0, r1 = R(0, 2), R(1, 2)
    for b in (r0, r1):
        b.coll(n=2)
    r0.wait(op="all_reduce")
    r1.wait(op="all_gather")
    d = diagnose(snap([r0, r1]))
    assert (d.kind, d.culprit_ranks) == ("collective-mismatch", [0, 1]), d.summary


def test_gloo_size_mismatch_abort_is_a_mismatch_naming_the_dead_rank():
    # verl #6365: buffers broadcast in different orders: rank 1 receives 1024 elements
    # where it expects 4 and gloo aborts it; rank 0 fails with a connection error
    r0, r1 = R(0, 2), R(1, 2)
    for b in (r0, r1):
        b.coll(n=2)
    r0.coll(
        op="broadcast", numel=4, peer=0, state="failed", error="Connection closed by peer [127.0.0.1]:1234"
    )
    r1.coll(op="broadcast", numel=1024, peer=0, state="issued")
    p0 = r0.set(
        state="exited",
        exit_code=1,
        events=[
            {
                "event": "exception",
                "type": "RuntimeError",
                "wall_ns": r0.t + 50 * MS,
                "message": "Connection closed by peer [127.0.0.1]:1234",
            }
        ],
    ).build()
    p1 = r1.set(
        state="killed", signals={"fatal": {"wall_ns": r1.t + MS, "text": "Fatal Python error: Aborted\n"}}
    ).build()
    d = diagnose(snap([p0, p1], reason="death"))
    assert (d.kind, d.cause, d.culprit_ranks) == ("collective-mismatch", "mismatch", [1]), d.summary
    assert sorted(s["numel"] for s in d.details["signatures"]) == [4, 1024]
    assert any("gloo aborts the rank that receives more data" in e for e in d.evidence), d.evidence


def test_one_complete_step_is_a_baseline_when_the_ring_holds_the_whole_history():
    # divergence already in step 2 (blind job tr_dl_extra): step 1 is complete and the ring
    # starts at record 1, so it is the baseline
    r0, r1 = R(0, 2), R(1, 2)
    for b in (r0, r1):
        steps(b, 1, 3)
        b.mark(step=2)
        b.coll(n=3)
    r0.wait(op="all_reduce")
    r1.mark(step=3)
    r1.wait(op="all_gather")
    d = diagnose(snap([r0, r1]))
    assert (d.kind, d.culprit_ranks) == ("collective-mismatch", [0]), d.summary


def _extra_batch_against_eval(first_step_collectives):
    """Rank 1 trains one batch more (its all-reduce in step 4) while rank 0 left the loop
    into eval's barrier in step 3; the first step issues ``first_step_collectives``, each
    later one a single all_reduce. Returns the diagnosis."""
    r0, r1 = R(0, 2), R(1, 2)
    for b in (r0, r1):
        b.mark(step=1)
        b.coll(n=first_step_collectives)
        steps(b, 2, 1, start=2)
    r1.mark(step=4)
    r1.wait(op="all_reduce")
    r0.mark(phase="eval", kind="phase_enter")
    r0.wait(op="barrier", numel=0)
    return diagnose(snap([r0, r1]))


def test_two_ranks_at_different_steps_the_one_that_left_its_loop_is_named():
    """Blind job ddp_extra_batch (2 ranks): rank 0's data ran out first and it went into
    eval's barrier while rank 1 trains one batch more. No per-step count decides (the first
    step also broadcast DDP's buffers: 3 collectives); each rank's own history does (issue
    37): rank 0's barrier is new to its loop and outside its loop's phase, rank 1's
    all_reduce is the one every step issued: rank 0 left its loop early."""
    d = _extra_batch_against_eval(3)
    assert (d.kind, d.culprit_ranks) == ("collective-mismatch", [0]), d.summary
    assert d.details["changed_by_history"]["left_loop"] == [0], d.details
    assert "Rank 0 left its loop early" in d.summary and "Next: find what ended" in d.summary, d.summary


def test_a_rank_that_left_its_loop_into_another_phase_did_not_issue_one_more():
    """Clean per-step baseline (one all_reduce per step): rank 0's eval barrier is not
    'one more collective in step 3' (another phase than the loop's, stepcounts.py): it left
    its loop early, and history names it so, not the per-step count."""
    d = _extra_batch_against_eval(1)
    assert (d.kind, d.culprit_ranks) == ("collective-mismatch", [0]), d.summary
    assert not any("per-step collective count" in e for e in d.evidence), d.evidence
    assert any("left its loop early" in e for e in d.evidence), d.evidence
