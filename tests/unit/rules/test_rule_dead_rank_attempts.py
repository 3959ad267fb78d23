"""A rank restarted by torchrun (--max-restarts 2) that fails the same way in every attempt
(blind helper 68: a bad sample after the step-5 checkpoint kills rank 2 at step 7 three
times; four snapshots, none saying that the attempts failed alike)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ruleutil import check  # noqa: E402
from synth import MS, S, R, snap, world  # noqa: E402

from hangtrace.tracer.analyze.diagnose import diagnose  # noqa: E402

ERR = (
    "Caught ValueError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
    '  File "/job/train.py", line 52, in collate\n    raise ValueError("sequence length 0 (sample 77)")\n'
    "ValueError: sequence length 0 (sample 77)"
)


def _attempt(n, t0):
    """One attempt: ranks 0-2 (pids 100n + r), rank 2 raises at step 7, the others are cascade."""
    procs = []
    for r in range(3):
        b = R(r, 3, groups=[world(3)], pid=100 * n + r, t0=t0 + r * 10)
        b.set(meta={"ppid": 99, "rank_source": 1})
        for step in (5, 6, 7):
            b.mark(step=step)
            b.coll()
        if r == 2:
            b.set(
                state="exited",
                exit_code=1,
                events=[{"event": "exception", "type": "ValueError", "wall_ns": b.t + MS, "message": ERR}],
            )
        else:
            b.t += S
            b.set(state="killed")
        procs.append(b)
    return procs


def test_a_rank_that_failed_alike_in_every_attempt_says_so_once():
    attempts = [_attempt(n, 1_000 * S + n * 20 * S) for n in (1, 2, 3)]
    d = check(diagnose(snap([b for a in attempts for b in a], reason="death")), "dead-rank", [2])
    assert d.details["attempts"]["count"] == 3 and d.details["attempts"]["same"] == 3, d.details.get(
        "attempts"
    )
    assert "It ran in 3 attempts (restarts); each ended the same way." in d.summary, d.summary
    assert (
        "cause: exception: ValueError: sequence length 0 (sample 77) (caught ValueError in DataLoader worker "
        "process 0))" in d.summary
    ), d.summary


def test_a_transport_failure_before_every_other_death_and_only_sigterms_after_it_is_the_root():
    """Helper 68's run without the store workaround: after the restart rank 0's
    init_process_group failed ("Gloo connectFullMesh failed ... Connection refused"), then
    torchrun SIGTERMed ranks 1 and 2; the verdict blamed rank 1's SIGTERM."""
    procs = []
    for r in range(3):
        b = R(r, 3, groups=[world(3)], pid=300 + r)
        b.set(meta={"ppid": 99, "rank_source": 1})
        b.coll()
        procs.append(b)
    procs[0].set(
        state="exited",
        exit_code=1,
        events=[
            {
                "event": "exception",
                "type": "RuntimeError",
                "wall_ns": procs[0].t + MS,
                "message": "Gloo connectFullMesh failed with [pair.cc:152] timed out connecting: SO_ERROR: Connection refused",
            }
        ],
    )
    for b in procs[1:]:
        b.set(
            state="killed",
            signals={"sigterm": {"text": "Fatal Python error: SIGTERM", "wall_ns": procs[0].t + S}},
        )
    d = check(diagnose(snap(procs, reason="death")), "dead-rank", [0])
    assert "Gloo connectFullMesh failed" in d.summary, d.summary
    assert sorted(c["rank"] for c in d.cascade) == [1, 2]
