"""A mismatch whose culprit is in a collective torch issued itself (only the Flight Recorder
saw it) while the others wait in a Python call the culprit never made (blind helper 82: rank
2's eval raised, ``except: continue`` skipped its ``all_gather_object`` and ``barrier``, and it
went into the next step's backward, where DDP all-reduces; the verdict blamed "its thread
'python3'", the autograd thread torch's record named)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ruleutil import check  # noqa: E402
from synth import ranks, snap  # noqa: E402

from hangtrace.tracer.ring.frrecords import FR_JOINED_SOURCE, FR_SOURCE  # noqa: E402
from hangtrace.tracer.analyze.diagnose import diagnose  # noqa: E402


def _job(culprit_called=False):
    b = ranks(3, steps=1)  # (all_reduce call 1)
    for r in range(3):
        b[r].coll(op="all_gather_object")  # call 2
        b[r].coll(op="barrier")  # call 3
    for r in (0, 1):
        b[r].wait(op="all_gather_object", seq=19).update(source=FR_JOINED_SOURCE, seq_ours=4)
    if culprit_called:  # it made the call (its own count 4) and then torch issued one more
        b[2].coll(op="all_gather_object", seq=18).update(source=FR_JOINED_SOURCE, seq_ours=4)
    b[2].wait(op="all_reduce", seq=19, numel=610).update(source=FR_SOURCE, thread="python3")
    return diagnose(snap(b))


def test_the_culprit_never_made_the_call_the_others_wait_in():
    d = check(_job(), "collective-mismatch", [2])
    assert d.details["skipped_call"] == {
        "rank": 2,
        "op": "all_gather_object",
        "call": 4,
        "last_op": "barrier",
        "last_call": 3,
        "waiters": [0, 1],
    }
    assert "group_threads" not in d.details  # torch's C++ thread is no thread of the program
    assert (
        "Rank 2 never called all_gather_object: ranks 0-1 wait in it (call 4 on the group by the program's "
        "own count), while rank 2's last call there was barrier (call 3)"
    ) in d.summary, d.summary
    assert "exception swallowed on that rank" in d.summary


def test_no_skipped_call_when_the_culprit_made_it():
    d = _job(culprit_called=True)
    assert "skipped_call" not in d.details


def _eval_job(skipper_phase="train"):
    """3 ranks, two gradient all_reduces per step and an eval all_gather_object after every
    2nd step, all Python calls (no DDP); at the 2nd eval rank 2 issues the next step's
    all_reduce instead (blind helper 86: Ray trainer actors, ``except`` around the eval)."""
    b = ranks(3, steps=4)
    for x in b:
        x.coll(op="all_gather_object", dtype="object")
        x.coll(n=4)
    for x in b[:2]:
        x.wait(op="all_gather_object", dtype="object")
    b[2].phase = skipper_phase
    b[2].wait()
    return b


def test_a_culprit_that_issued_the_groups_steady_op_went_on_past_the_others_call():
    d = check(diagnose(snap(_eval_job())), "collective-mismatch", [2])
    sk = d.details["skipped_call"]
    assert (sk["op"], sk["into"], sk["by_torch"], sk["last_call"]) == (
        "all_gather_object",
        "all_reduce",
        False,
        5,
    ), sk
    assert (
        "Rank 2 never called all_gather_object: ranks 0-1 wait in it, while rank 2 issued all_reduce there, the "
        "collective ranks 0-1 issued just before it: it went on past all_gather_object (its previous one on this "
        "group: seq 5, in step with ranks 0-1)."
    ) in d.summary, d.summary
    assert "exception swallowed on that rank" in d.summary


def test_a_culprit_in_a_phase_of_its_own_did_not_go_on():
    """Rank 2's all_reduce is in a phase the others' all_reduces were not in (a rank-only
    checkpoint): an extra collective, not the stream it went on in."""
    d = check(diagnose(snap(_eval_job(skipper_phase="checkpoint"))), "collective-mismatch", [2])
    assert "skipped_call" not in d.details, d.details
