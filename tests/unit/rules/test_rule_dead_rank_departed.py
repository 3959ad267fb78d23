"""Rule dead_rank, a departure (analyze/failures/departures.py): a rank's program returned (exit code
0) while its peers still ran the job, and their collectives then failed with transport
errors: the rank that left is named ('skipped-collective', cause 'skipped'), not a peer,
not "no rank is dead ... check the network" (blind helper 92: a graceful-preemption SIGTERM
handler on one rank)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ruleutil import check  # noqa: E402
from synth import MS, S, ranks, snap  # noqa: E402

from hangtrace.tracer.analyze.diagnose import diagnose  # noqa: E402
from hangtrace.tracer.collect.ringprocs import signal_sender  # noqa: E402
from hangtrace.tracer.report.advice import DEPARTED_NEXT, PREEMPTED_NEXT  # noqa: E402
from hangtrace.tracer.report.paragraph import verdict_paragraph  # noqa: E402

CLOSED = "[../gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:20363"
SENDER = "hangtrace: SIGTERM from pid 4242 uid 0: bash -c sleep 6; kill -TERM 1002\n"
SIGTERM_DUMP = (
    "Current thread 0x00007facd51bab80 (most recent call first):\n"
    '  File "/tmp/job.py", line 103 in main\n  File "/tmp/job.py", line 109 in <module>\n'
)


def _job(sigterm=True, leaver_exits_at=0.0, peers_fail_in_exit_handler=False):
    """4 ranks, 5 all_reduces each; rank 2 returns (exit code 0) at ``leaver_exits_at`` s after
    its last; 0.8 s after that moment ranks 0, 1, 3 raise 'Connection closed by peer' (in DDP's
    backward: no failed record of ours) and exit 1."""
    b = ranks(4, steps=5)
    t_leave = b[2].t + int(leaver_exits_at * S) + 300 * MS
    events = [
        {"event": "exiting", "threads": [], "more": 0, "wall_ns": t_leave},
        {"event": "exit", "wall_ns": t_leave + 20 * MS},
    ]
    b[2].set(
        state="exited",
        exit_code=0,
        exit_wall_ns=t_leave + 20 * MS,
        events=events,
        phase=None,
        signals={
            "sigterm": {
                "wall_ns": t_leave - 100 * MS,
                "text": SENDER + SIGTERM_DUMP,
                "sender": signal_sender(SENDER),
            }
        }
        if sigterm
        else {},
    )
    t_fail = b[2].t + 300 * MS + 800 * MS
    for r in (0, 1, 3):
        exc = {"event": "exception", "type": "RuntimeError", "message": CLOSED, "wall_ns": t_fail + r * MS}
        exiting = {
            "event": "exiting",
            "threads": [],
            "more": 0,
            "wall_ns": t_fail + r * MS + (-S if peers_fail_in_exit_handler else MS),
        }
        b[r].set(
            state="exited",
            exit_code=1,
            exit_wall_ns=t_fail + 200 * MS,
            events=[exiting, exc] if peers_fail_in_exit_handler else [exc, exiting],
        )
    return snap(b, reason="death")


def test_a_rank_that_returned_before_its_peers_failed_is_named_with_its_sigterm():
    d = check(diagnose(_job()), "skipped-collective", [2])
    assert d.cause == "skipped"
    dep = d.details["departed"]
    assert dep["rank"] == 2 and "exit code 0" in dep["text"]
    assert "ranks 0-1,3 failed" in dep["after"] and "not the network" in dep["after"], dep
    assert "SIGTERM" in dep["sigterm"] and "main (job.py:103)" in dep["sigterm"], dep
    assert "from pid 4242 (bash -c sleep 6; kill -TERM 1002)" in dep["sigterm"], dep
    assert "not recorded" not in dep["sigterm"]
    assert sorted(c["rank"] for c in d.cascade) == [0, 1, 3]
    p = verdict_paragraph(d)
    assert p.startswith("Skipped collective: rank 2 left: its program returned (exit code 0)"), p
    assert "It had received SIGTERM" in p and PREEMPTED_NEXT in p, p
    assert "no rank is dead" not in p


def test_without_a_sigterm_the_advice_is_about_an_early_end_of_the_loop():
    d = check(diagnose(_job(sigterm=False)), "skipped-collective", [2])
    assert "sigterm" not in d.details["departed"]
    p = verdict_paragraph(d)
    assert DEPARTED_NEXT in p and "SIGTERM" not in p, p


def test_a_clean_exit_after_the_first_failure_is_no_departure():
    """Rank 2 returns 1.5 s after the peers' failure (0.8 s after the 0.3 s mark): the failure came
    first, so nothing says rank 2's leaving caused it: the transport error stands."""
    d = diagnose(_job(leaver_exits_at=1.5))
    assert "departed" not in d.details and d.culprit_ranks != [2], (d.kind, d.culprit_ranks)


def test_peers_that_failed_in_an_exit_handler_did_not_fail_because_of_a_departure():
    """The failing collectives came after the failing ranks' own programs had returned (an
    atexit all_reduce after the others left, blind helper 87): not a departure."""
    d = diagnose(_job(peers_fail_in_exit_handler=True))
    assert "departed" not in d.details, (d.kind, d.culprit_ranks, d.evidence)


def test_the_sender_line_of_a_sigterm_stack_file():
    assert signal_sender(SENDER + SIGTERM_DUMP) == {
        "pid": 4242,
        "uid": 0,
        "cmdline": "bash -c sleep 6; kill -TERM 1002",
    }
    assert signal_sender(SIGTERM_DUMP) is None
    assert (
        signal_sender("hangtrace: SIGTERM from pid 7 uid 1000: bash (exited)\n")["cmdline"] == "bash (exited)"
    )


def test_a_sigterm_death_names_its_sender():
    """A rank SIGTERMed at work (in a phase) dies of it: the cause text says who sent it."""
    b = ranks(2, steps=3)
    b[1].set(
        state="killed",
        signals={
            "sigterm": {
                "wall_ns": b[1].t + MS,
                "text": SENDER + SIGTERM_DUMP,
                "sender": signal_sender(SENDER),
            }
        },
    )
    d = check(diagnose(snap(b, reason="death")), "dead-rank", [1])
    assert (
        d.cause == "sigterm" and "from pid 4242 (bash -c sleep 6; kill -TERM 1002)" in d.details["cause_text"]
    )
