"""Rule diverged: a rank blocked at a seq every other member already passed
(collective-mismatch / sequence-diverged)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ruleutil import check  # noqa: E402
from synth import ranks, snap  # noqa: E402

from hangtrace.tracer.analyze.diagnose import diagnose  # noqa: E402
from hangtrace.tracer.diagnosis import Cause  # noqa: E402


def test_rank_behind_a_group_that_passed_its_seq_is_sequence_diverged():
    b = ranks(3, steps=3)
    b[0].wait()  # rank 0 blocks in seq 4 ...
    b[1].coll(n=2)  # ... which ranks 1 and 2 already passed (their seq is 5)
    b[2].coll(n=2)
    d = check(diagnose(snap(b)), "collective-mismatch", [0])
    assert d.cause == Cause.SEQUENCE_DIVERGED
    assert d.seq == 4
    assert any("already passed" in e for e in d.evidence)
    assert "sequence of collectives on this group diverged" in d.summary


def test_diverged_rank_that_others_wait_for_is_named():
    b = ranks(2, steps=3)
    b[0].wait()  # rank 0 in seq 4 of the world group
    b[1].coll(n=1)  # rank 1 passed seq 4 and now waits in seq 5 for rank 0
    b[1].wait()
    d = check(diagnose(snap(b)), "collective-mismatch", [0])
    assert d.cause == Cause.SEQUENCE_DIVERGED
    assert d.waiting_ranks == [1]
