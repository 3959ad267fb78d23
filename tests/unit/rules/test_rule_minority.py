"""Rule minority: the waiting minority diverged while the others moved on (skipped-collective / extra-collective)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ruleutil import check  # noqa: E402
from synth import ranks, snap  # noqa: E402

from hangtrace.tracer.analyze.diagnose import diagnose  # noqa: E402
from hangtrace.tracer.report.paragraph import verdict_paragraph  # noqa: E402


def test_rank0_extra_collective_others_moved_on_minority_named():
    b = ranks(4)
    b[0].wait(op="barrier")
    for r in (1, 2, 3):
        b[r].set(state="exited", exit_code=0)
    d = check(diagnose(snap(b)), "skipped-collective", [0])
    assert d.cause == "extra-collective"
    assert d.op == "barrier"


def test_minority_whose_collective_failed_and_which_exited_does_not_wait_forever():
    """Helper 70: a logger's atexit barrier on rank 0 after ranks 1-2 destroyed their
    group: gloo raised, the handler swallowed it, every process exited 0. Rank 0 is still
    the one that took another path, but it waits for nothing: the paragraph says so."""
    b = ranks(3)
    b[0].coll(
        op="barrier",
        state="failed",
        error="RuntimeError: [/__w/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] "
        "Connection closed by peer [127.0.0.1]:33515. This is typically caused by ...",
    )
    for r in range(3):
        b[r].set(state="exited", exit_code=0)
    d = check(diagnose(snap(b)), "skipped-collective", [0])
    assert d.cause == "extra-collective" and d.op == "barrier"
    assert d.details["minority_failed"] == {
        "0": "it failed there (RuntimeError: Connection closed by peer [127.0.0.1]:33515) and exited cleanly (code 0)"
    }
    text = verdict_paragraph(d)
    assert "forever" not in text and "the program caught the error" in text


def test_a_minority_collective_entered_after_the_program_returned_is_in_an_exit_handler():
    """Helper 87: rank 1's metrics logger all_reduces in its atexit handler (its ``exiting``
    event, the main program's return, comes first): the paragraph says so and the advice
    speaks of exit handlers, not of rank-0-only code."""
    b = ranks(3)
    b[1].set(events=[{"event": "exiting", "threads": [], "more": 0, "wall_ns": b[1].t + 1000}])
    b[1].coll(
        op="all_reduce", state="failed", error="RuntimeError: Connection closed by peer [127.0.0.1]:11144"
    )
    for r in range(3):
        b[r].set(state="exited", exit_code=0)
    d = check(diagnose(snap(b)), "skipped-collective", [1])
    assert d.details["minority_at_exit"] == [1], d.details
    text = verdict_paragraph(d)
    assert (
        "it entered it after its program had returned, in an exit handler (atexit, or a thread ending at "
        "shutdown); it failed there (RuntimeError: Connection closed by peer [127.0.0.1]:11144) and exited "
        "cleanly (code 0): the program caught the error."
    ) in text, text
    assert "do the final collective in the program on every rank, before `destroy_process_group()`" in text


def test_a_lone_exit_handler_collective_is_named_with_two_ranks_too():
    """Two ranks: rank 1's atexit all_reduce after rank 0 had destroyed its group and left.
    One waiter against one that left is no minority, but the exit handler is what diverged
    (the chain named rank 0, which "never reached" it)."""
    b = ranks(2)
    b[1].set(events=[{"event": "exiting", "threads": [], "more": 0, "wall_ns": b[1].t + 1000}])
    b[1].coll(
        op="all_reduce",
        state="failed",
        error="RuntimeError: Read error [127.0.0.1]:28879: Connection reset by peer",
    )
    for r in range(2):
        b[r].set(state="exited", exit_code=0)
    d = check(diagnose(snap(b)), "skipped-collective", [1])
    assert d.details["minority_at_exit"] == [1], d.details


def test_minority_still_waiting_waits_forever():
    b = ranks(3)
    b[0].wait(op="barrier")
    for r in (1, 2):
        b[r].set(state="exited", exit_code=0)
    d = check(diagnose(snap(b)), "skipped-collective", [0])
    assert "minority_failed" not in d.details
    assert "waits forever" in verdict_paragraph(d)
