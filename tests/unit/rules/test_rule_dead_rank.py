"""Rule dead_rank and the arbiter: the earliest non-victim death, hang-versus-death precedence (dead-rank / its cause)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ruleutil import QUEUE_GET, check  # noqa: E402
from synth import MS, T0, S, ranks, snap, stack  # noqa: E402

from hangtrace.tracer.analyze.diagnose import diagnose  # noqa: E402


def test_sigkilled_rank_whose_last_completion_follows_peer_wait_is_dead():
    """kill-rank: rank 1 completes cp seq 6 a little after rank 0 issued seq 7, then is
    SIGKILLed (no record). Its last sign of life is after the wait began, but it issued
    nothing new: dead-rank, not 'moved on'."""
    b = ranks(2)
    b[0].wait()  # seq 4 issued at t
    b[1].coll(n=1, seq=3)  # re-records its seq 3, completing after rank 0's issue
    b[1].records[-1]["t_wall_ns"] = b[0].t - MS // 2
    b[1].records[-1]["t_mono_ns"] = b[1].records[-1]["t_wall_ns"] - T0
    b[1].records[-1]["t_end_mono_ns"] = b[0].t - T0 + MS
    b[1].t = b[0].t + MS  # progress stamped at that completion
    b[1].set(state="killed")
    d = check(diagnose(snap(b)), "dead-rank", [1])
    assert d.cause == "killed-without-record"


def test_dead_rank_killed_first_then_connection_closed_cascade():
    b = ranks(4, steps=5)
    b[2].set(state="killed")  # SIGKILL: no record of it, last sign of life
    for r in (0, 1, 3):
        b[r].t += 2 * S
        b[r].coll(
            state="failed",
            error="[../gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]:1234",
        )
        b[r].set(
            state="exited",
            exit_code=1,
            events=[
                {
                    "event": "exception",
                    "type": "RuntimeError",
                    "wall_ns": b[r].t + MS,
                    "message": "Connection closed by peer [10.0.0.2]:1234",
                }
            ],
        )
    d = check(diagnose(snap(b)), "dead-rank", [2])
    assert d.cause == "killed-without-record"
    assert sorted(c["rank"] for c in d.cascade) == [0, 1, 3]
    assert all(c["victim"] for c in d.cascade)
    assert d.group == "0" and d.seq == 6


def test_sigterm_after_a_transport_failure_is_cascade_not_an_external_kill():
    """torchrun: rank 1 dies of an exception (its DataLoader worker was SIGKILLed; a blind
    job); rank 0's all_reduce fails with 'Connection closed by peer', then the agent SIGTERMs
    it. Rank 0 is a victim (cascade), not a SIGTERM from outside to look for."""
    b = ranks(2, steps=5)
    b[1].set(
        state="exited",
        exit_code=1,
        events=[
            {
                "event": "exception",
                "type": "RuntimeError",
                "wall_ns": b[1].t + MS,
                "message": "DataLoader worker (pid 4242) is killed by signal: Killed.",
            }
        ],
    )
    b[0].t += 2 * S
    b[0].coll(
        state="failed", error="[../gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:1234"
    )
    b[0].set(state="killed", signals={"sigterm": {"wall_ns": b[0].t + S, "text": ""}})
    d = check(diagnose(snap(b)), "dead-rank", [1])
    assert d.cause == "exception"
    assert [(c["rank"], c["victim"]) for c in d.cascade] == [(0, True)], d.cascade


@pytest.mark.parametrize(
    "setup,cause",
    [
        (dict(state="killed", signals={"sigterm": {"wall_ns": T0 + 10 * S, "text": ""}}), "sigterm"),
        (
            dict(
                state="killed",
                signals={
                    "fatal": {"wall_ns": T0 + 10 * S, "text": "Fatal Python error: Segmentation fault\n"}
                },
            ),
            "fatal-signal",
        ),
        (
            dict(
                state="exited",
                exit_code=1,
                events=[
                    {
                        "event": "exception",
                        "type": "ValueError",
                        "message": "bad batch",
                        "wall_ns": T0 + 10 * S,
                    }
                ],
            ),
            "exception",
        ),
        (dict(state="exited", exit_code=3), "exit-code 3"),
        (dict(state="killed", exit_code=-15), "sigterm"),
    ],
)
def test_dead_rank_causes(setup, cause):
    b = ranks(3)
    for r in (0, 2):
        b[r].t += 20 * S  # the others reach the next collective after rank 1 died
        b[r].wait()
    b[1].set(**setup)
    d = check(diagnose(snap(b)), "dead-rank", [1])
    assert d.cause == cause
    if cause == "exception":
        assert d.details["cause_text"] == "ValueError: bad batch"


def test_first_death_by_time_is_root():
    b = ranks(4)
    b[3].set(
        state="exited",
        exit_code=1,
        events=[{"event": "exception", "type": "OSError", "message": "disk full", "wall_ns": T0 + 50 * S}],
    )
    b[1].set(
        state="exited",
        exit_code=1,
        events=[{"event": "exception", "type": "KeyError", "message": "'x'", "wall_ns": T0 + 20 * S}],
    )
    d = check(diagnose(snap(b)), "dead-rank", [1])
    assert [c["rank"] for c in d.cascade] == [3]


def test_hang_then_sigterm_all_keeps_hang_verdict():
    b = ranks(3)
    b[0].wait()
    b[1].wait()
    later = b[1].t + 3600 * S
    for x in b:
        x.set(state="killed", signals={"sigterm": {"wall_ns": later + x.rank, "text": ""}})
    b[2].set(stacks=stack(*QUEUE_GET))
    d = check(diagnose(snap(b)), "stuck-outside-collective", [2])
    assert "killed later: sigterm" in d.details["culprit_reasons"]["2"]


def _raises_later(exc_type, moved_on=False):
    """Rank 1 never reached the all_reduce ranks 0 and 2 wait in: it raised ``exc_type``
    5 s after they began waiting (a DataLoader whose worker the kernel OOM-killed: blind
    job tr_dl_oom), having first moved on to its next step when ``moved_on``; its
    dying records (exception, exit) come after the wait began."""
    b = ranks(3)
    for r in (0, 2):
        b[r].wait()
    start = b[0].t
    if moved_on:
        b[1].t = start + S
        b[1].mark("step", step=b[1].step + 1)
    b[1].t = start + 5 * S
    b[1].mark("phase_exit")
    b[1].set(
        state="exited",
        exit_code=1,
        exit_wall_ns=start + 5 * S + MS,
        events=[
            {
                "event": "exception",
                "type": exc_type,
                "wall_ns": start + 5 * S,
                "message": "DataLoader worker (pid(s) 4242) exited unexpectedly",
            }
        ],
    )
    return diagnose(snap(b))


def test_an_own_exception_after_the_wait_began_without_moving_on_is_the_root():
    d = check(_raises_later("RuntimeError"), "dead-rank", [1])
    assert d.cause == "exception" and "DataLoader worker" in d.details["cause_text"]
    # it never reached the waiters' seq 4: "before", not "during/after" it
    assert "before all_reduce seq 4" in d.summary and "(its last there: seq 3)" in d.summary, d.summary


def test_an_exception_after_moving_on_is_not_why_the_others_wait():
    d = _raises_later("RuntimeError", moved_on=True)
    assert (d.kind, d.culprit_ranks) == ("skipped-collective", [1]), d.summary
    assert "killed later: exception" in d.details["culprit_reasons"]["1"]


def test_a_stop_exception_after_the_wait_began_keeps_the_hang():
    """Ctrl-C of a hung job raises KeyboardInterrupt in the rank: a stop, not the root."""
    d = _raises_later("KeyboardInterrupt")
    assert d.kind != "dead-rank" and d.culprit_ranks == [1], d.summary


def test_sigterm_decides_whatever_the_exit_code():
    """Issue 9, the founding report: Ray turns a SIGTERM into its own graceful exit (code 0
    or 1); the SIGTERM dump of a rank that was at work decides the cause. An idle process
    SIGTERMed at the end of a clean run (``ray.shutdown()``) did not die of it."""
    import dataclasses
    from synth import MS, R, snap
    from hangtrace.tracer.analyze.diagnose import diagnose

    r0, r1 = R(0, 2), R(1, 2)
    for b in (r0, r1):
        b.coll(n=3)
    r0.wait()
    term = {"sigterm": {"wall_ns": r1.t + 5 * MS, "text": "Thread 0x1 (most recent call first):\n"}}
    p1 = r1.set(state="exited", exit_code=0, signals=term, phase="train_step").build()
    d = diagnose(snap([r0.build(), p1], reason="death"))
    assert (d.kind, d.culprit_ranks, d.cause) == ("dead-rank", [1], "sigterm"), d.summary
    idle = dataclasses.replace(p1, phase=None)
    d2 = diagnose(snap([r0.build(), idle], reason="death"))
    assert d2.kind != "dead-rank", d2.summary


def _sigterm_in_wait(wait_s, peer_passed):
    """Rank 1 is SIGTERMed ``wait_s`` into an all_reduce; rank 0 either passed it (and then
    died of the closed connection) or never reached it."""
    b = ranks(2)
    b[1].wait()  # rank 1 waits in seq N
    start = b[1].records[-1]["t_wall_ns"]
    b[1].set(
        state="killed", exit_code=-15, signals={"sigterm": {"wall_ns": start + int(wait_s * S), "text": ""}}
    )
    if peer_passed:
        b[0].coll(n=1)  # rank 0 completes seq N with rank 1's data ...
        b[0].t = start + int(wait_s * S) + 50 * MS
        b[0].wait()  # ... and fails in seq N+1
        b[0].records[-1].update(state="failed", error="Connection closed by peer [127.0.0.1]:1")
        b[0].set(
            state="exited",
            exit_code=1,
            events=[
                {
                    "event": "exception",
                    "type": "RuntimeError",
                    "wall_ns": b[0].t + MS,
                    "message": "Connection closed by peer [127.0.0.1]:1",
                }
            ],
        )
    else:
        b[0].set(stacks=stack(*QUEUE_GET))
    return snap(b, reason="death")


@pytest.mark.parametrize("wait_s", [0.3, 30.0])
def test_sigterm_in_a_collective_the_peer_completed_is_the_root(wait_s):
    """CI, 2026-12-01 (examples/mem_faults.py --fault sigterm on a loaded machine): rank 1
    was SIGTERMed while waiting in an all_reduce for a slower peer, which then completed it
    and died of the closed connection. The collective was not hung: the SIGTERM is the root
    (it had been called a victim of a 'sequence diverged' hang)."""
    d = check(diagnose(_sigterm_in_wait(wait_s, peer_passed=True)), "dead-rank", [1])
    assert d.cause == "sigterm"
    assert [c["rank"] for c in d.cascade] == [0]


def test_sigterm_after_a_long_wait_nobody_completed_stays_a_victim():
    """Rank 1 waited 30 s in an all_reduce rank 0 never reached (rank 0 is in queue.get),
    then was SIGTERMed: the user stopped a hung job; the hang is the verdict."""
    d = check(diagnose(_sigterm_in_wait(30.0, peer_passed=False)), "stuck-outside-collective", [0])
    assert "sigterm" in d.summary.lower() or any(c["rank"] == 1 for c in d.cascade)


def test_sigterm_early_in_a_wait_is_the_root_even_when_the_peer_never_came():
    """A SIGTERM 0.3 s into a wait (preemption, a kill of one rank) is no stopped hang."""
    d = check(diagnose(_sigterm_in_wait(0.3, peer_passed=False)), "dead-rank", [1])
    assert d.cause == "sigterm"


def test_sigterm_that_unwound_an_actor_method_is_a_death_at_work():
    """Ray's SIGTERM handler raises SystemExit in the worker: the trainer's method phase
    ends failed ('SystemExit: 1') and the process exits 0 with no phase open. It was at
    work when stopped: dead-rank, sigterm - not 'exited cleanly' (blind job
    ray_trainer_sigterm)."""
    from synth import MS, R, snap
    from hangtrace.tracer.analyze.diagnose import diagnose

    r0, r1 = R(0, 2), R(1, 2)
    for b in (r0, r1):
        b.coll(n=3)
    r0.wait()
    r1.phase = "train_step"
    r1.mark("phase_enter")
    x = r1.mark("phase_exit")
    x.update(state="failed", error="SystemExit: 1")
    r1.phase = None
    term = {"sigterm": {"wall_ns": x["t_wall_ns"] - MS, "text": "Thread 0x1 (most recent call first):\n"}}
    p1 = r1.set(state="exited", exit_code=0, signals=term, phase=None).build()
    d = diagnose(snap([r0.build(), p1], reason="death"))
    assert (d.kind, d.culprit_ranks) == ("dead-rank", [1]) and d.cause in ("sigterm", "sigterm-external"), (
        d.summary
    )


def test_rank_still_exiting_after_its_sigterm_died_before_a_peer_killed_by_the_shutdown():
    """Blind job ray_trainer_sigterm (RESULTS.md, 23:40): rank 1 is SIGTERMed at work and is
    still inside Ray's graceful exit when the snapshot is taken; the driver's shutdown kills
    rank 0 56 ms later. Rank 1 died first (at its SIGTERM), not rank 0."""
    from synth import R

    r0, r1 = R(0, 2), R(1, 2)
    for b in (r0, r1):
        b.coll(n=3)
    r0.wait()
    t_term = r1.t + 5 * MS
    p1 = r1.set(
        state="alive", signals={"sigterm": {"wall_ns": t_term, "text": "Thread 0x1:\n"}}, phase="train_step"
    ).build()
    p0 = r0.set(
        state="killed", signals={"sigterm": {"wall_ns": t_term + 56 * MS, "text": "Thread 0x2:\n"}}
    ).build()
    d = diagnose(snap([p0, p1], reason="death"))
    assert (d.kind, d.culprit_ranks, d.cause) == ("dead-rank", [1], "sigterm"), d.summary


def test_waiters_in_torchs_count_and_a_dead_rank_in_ours_are_not_compared():
    """Blind job tr_dl_oom: rank 0 waits in DDP's gradient all-reduce, known from its Flight
    Recorder only (torch's count: seq 30); rank 1 died with no Flight Recorder dump, its
    last all_reduce seq 12 in hangtrace's count. The verdict shows rank 1's own seq, not
    "during/after all_reduce seq 30", and says whose count the waiters' seq is."""
    b = ranks(2, steps=12)
    w = b[0].wait(seq=30)
    w["source"] = "flight-recorder"
    b[1].set(
        state="exited",
        exit_code=1,
        events=[
            {
                "event": "exception",
                "type": "RuntimeError",
                "wall_ns": b[1].t + MS,
                "message": "DataLoader worker (pid(s) 4242) exited unexpectedly",
            }
        ],
    )
    d = check(diagnose(snap(b)), "dead-rank", [1])
    assert (d.group, d.seq, d.op) == ("0", 12, "all_reduce"), d.summary
    assert "seq 30" not in d.summary and "during/after all_reduce seq 12" in d.summary, d.summary
    assert any("seq 30 for it (torch's count, from the Flight Recorder" in e for e in d.evidence), d.evidence
    w["source"] = None  # both counts ours: the waiters' instance, as before
    d = check(diagnose(snap(b)), "dead-rank", [1])
    assert d.seq == 30 and not any("torch's count" in e for e in d.evidence), d.summary


def test_a_rank_with_its_exit_record_still_tearing_down_reads_exiting():
    """A blind job's report said 'alive exit code 1': the rank had written its exit record
    and raised, and its pid was still tearing down when the snapshot was taken."""
    b = ranks(2, steps=4)
    b[0].wait()
    b[1].set(
        state="alive",
        exit_code=1,
        events=[{"event": "exception", "type": "RuntimeError", "wall_ns": b[1].t + MS, "message": "x"}],
    )
    d = check(diagnose(snap(b)), "dead-rank", [1])
    assert any(
        "exiting (exit code 1 recorded; the process was still tearing down)" in e for e in d.evidence
    ), d.evidence


def test_a_dead_rank_without_a_stack_says_where_it_raised():
    """No stack of a dead rank: where it raised comes from its exception's traceback (the
    last one: a chained cause's frames come first), innermost first, with the user's own
    line (blind job tr_dl_oom: it died in ``for ... in enumerate(loader)``)."""
    tb = (
        'Traceback (most recent call last):\n  File "/usr/lib/python3/site-packages/torch/utils/data/'
        '_utils/signal_handling.py", line 73, in handler\nRuntimeError: inner\n\nThe above exception was the '
        'direct cause of the following exception:\n\nTraceback (most recent call last):\n  File "/job/job.py", '
        'line 142, in <module>\n    main()\n  File "/job/job.py", line 114, in train\n    for step, (x, y) in '
        'enumerate(loader):\n  File "/usr/lib/python3/site-packages/torch/utils/data/dataloader.py", line 725, '
        'in __next__\n  File "/usr/lib/python3/site-packages/torch/utils/data/dataloader.py", line 1505, in '
        '_next_data\n  File "/usr/lib/python3/site-packages/torch/utils/data/dataloader.py", line 1304, in '
        "_try_get_data\nRuntimeError: outer\n"
    )
    b = ranks(2, steps=4)
    b[0].wait()
    b[1].set(
        state="exited",
        exit_code=1,
        events=[
            {
                "event": "exception",
                "type": "RuntimeError",
                "wall_ns": b[1].t + MS,
                "message": "outer",
                "traceback": tb,
            }
        ],
    )
    d = check(diagnose(snap(b)), "dead-rank", [1])
    assert d.frames[:2] == ["_try_get_data (dataloader.py:1304)", "_next_data (dataloader.py:1505)"], d.frames
    assert (  # (issue 41: user-first - its own line, the call it made there, the internals folded)
        "; it raised in train (job.py:114) > __next__ (dataloader.py:725) > (1 more) > _try_get_data "
        "(dataloader.py:1304)" in d.summary
    ), d.summary


def test_a_breakpoint_left_in_the_code_is_said_to_be_one():
    """A `breakpoint()` under torchrun: stdin is no terminal, pdb reads end-of-input and raises
    BdbQuit (a job of ours, 2026-12-04: the Next said only 'read the exception')."""
    b = ranks(2)
    b[0].wait()
    b[1].set(
        state="exited",
        exit_code=1,
        events=[{"event": "exception", "type": "BdbQuit", "message": "", "wall_ns": b[0].t + S}],
    )
    d = check(diagnose(snap(b, reason="death")), "dead-rank", [1])
    assert "BdbQuit" in d.details["cause_text"]
    assert "Next: the rank stopped in the debugger: a `breakpoint()`" in d.summary, d.summary
    assert "PYTHONBREAKPOINT=0" in d.summary
