"""Rule left_phase: a cycle explained by a side that went through the phase of its peers'
collective without it (skipped-collective / skipped), not a cross-group deadlock (blind
job ray_slow_start_skip: trainer 2's empty micro-batch list skipped its gradient
all_reduces on 'train'; it waits in the weight broadcast while its peers wait for it)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ruleutil import check  # noqa: E402
from synth import group, ranks, snap, world  # noqa: E402

from hangtrace.tracer.analyze.diagnose import diagnose  # noqa: E402


def _rl(mode="skip"):
    """Trainers 0-3 ('train' = group 1) and a rollout (rank 4) on the world (group 0).
    Steps 1-2 complete: train_step (2 all_reduces on 'train'), sync_weights (broadcast on
    the world). Step 3: ranks 0, 1, 3 wait in the first 'train' all_reduce, the rollout in
    the broadcast; rank 2 waits in the broadcast too, having ``mode`` 'skip': entered and
    left train_step without the all_reduce; 'inside': never left train_step; 'reorder':
    gone to sync_weights without entering train_step (the methods in another order)."""
    g = [world(5), group("1", range(4), desc="train", order=1)]
    b = ranks(5, steps=1, groups=g)
    for step in (1, 2):
        for r, x in enumerate(b):
            if r < 4:
                x.mark("phase_enter", phase="train_step", step=step)
                x.coll("1", n=2)
                x.mark("phase_exit", phase="train_step")
            x.mark("phase_enter", phase="sync_weights" if r < 4 else "receive_weights")
            x.coll("0", op="broadcast")
            x.mark("phase_exit", phase=x.phase)
    for r in (0, 1, 3):
        b[r].mark("phase_enter", phase="train_step", step=3)
        b[r].wait("1")
    b[4].mark("phase_enter", phase="receive_weights", step=3)
    b[4].wait("0", op="broadcast")
    if mode in ("skip", "inside"):
        b[2].mark("phase_enter", phase="train_step", step=3)
    if mode == "skip":
        b[2].mark("phase_exit", phase="train_step")
    if mode != "inside":
        b[2].mark("phase_enter", phase="sync_weights")
    b[2].wait("0", op="broadcast")
    return b


def test_the_rank_that_went_through_the_phase_without_the_collective_skipped_it():
    d = check(diagnose(snap(_rl())), "skipped-collective", [2])
    assert d.cause == "skipped" and d.group == "1" and d.seq == 5 and d.op == "all_reduce"
    assert d.details["skipped_in_phase"] == "train_step"
    assert (
        "it went through phase 'train_step' without it (its last collective on that group: seq 4) and waits "
        "in broadcast seq 4 on group '0' at phase 'sync_weights'" in d.summary
    ), d.summary
    assert any(e.startswith("not a cross-group deadlock: rank 2 left phase 'train_step'") for e in d.evidence)


def test_a_rank_still_inside_the_phase_or_that_ran_the_phases_in_another_order_stays_a_deadlock():
    """Rank 2 waits in the broadcast from inside train_step (it never left it), or went to
    sync_weights without entering train_step at step 3: nothing says it will not issue
    the all_reduce later, so the rule stays silent; the deadlock says rank 2 broke the order
    every rank had kept until then (analyze/graph/grouporder.py)."""
    for mode in ("inside", "reorder"):
        d = diagnose(snap(_rl(mode)))
        assert d.kind == "cross-group-deadlock" and d.culprit_ranks == [2], (mode, d.summary)
        assert "skipped_in_phase" not in d.details
        assert d.details["broken_order"]["side"] == [2], d.details
