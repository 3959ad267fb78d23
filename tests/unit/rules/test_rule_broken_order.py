"""Rule broken_order: an apparent cycle over two groups explained by a minority that broke the
order in which every rank had interleaved them until then (blind helper 85: an eval on its own
group every 5 steps; rank 3's eval raised, ``except: continue`` skipped its all_reduce and
barrier, and it went into the next step's gradient all-reduce on the default group)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ruleutil import check  # noqa: E402
from synth import group, ranks, snap, world  # noqa: E402

from hangtrace.tracer.analyze.diagnose import diagnose  # noqa: E402

G = [world(4), group("1", range(4), desc="eval")]


def _eval_job(skipper=3, agreed_evals=1, early=None, moved_on=True):
    """Steps of 2 gradient all_reduces on '0' (after one at start); an eval (all_reduce,
    barrier) on '1' after every 2nd step; ``skipper`` goes on into the next step instead of
    eval number ``agreed_evals + 1`` (recording the next step when ``moved_on``); rank ``early``
    ran the first eval before its steps."""
    b = ranks(4, steps=1, groups=G)
    for _ in range(agreed_evals):
        for x in b:
            if x.rank != early:
                x.coll("0", n=4)
            x.coll("1", op="all_reduce")
            x.coll("1", op="barrier")
            if x.rank == early:
                x.coll("0", n=4)
    for x in b:
        x.coll("0", n=4)
    for x in b:
        if x.rank == skipper:
            if moved_on:
                x.mark("step", step=x.step + 1)
            x.wait("0")
        else:
            x.wait("1", op="all_reduce")
    return b


def test_a_minority_that_broke_the_agreed_order_of_two_groups_skipped():
    d = check(diagnose(snap(_eval_job())), "skipped-collective", [3])
    assert d.cause == "skipped" and d.group == "1" and d.seq == 3 and d.op == "all_reduce", d.summary
    bo = d.details["broken_order"]
    assert (bo["other_group"], bo["other_seq"], bo["agreed"]) == ("0", 10, [1, 2]), bo
    assert (
        "it went on without it to step 1 (its last collective on that group: barrier seq 2) into all_reduce seq 10 on "
        "group '0'"
    ) in d.summary, d.summary
    assert any(
        e.startswith("not a cross-group deadlock: until then every rank interleaved the two groups alike")
        for e in d.evidence
    ), d.evidence
    assert "exception swallowed on that rank" in d.summary


def test_without_a_later_step_the_broken_order_is_told_in_the_deadlock():
    """The records cannot tell a skip from groups entered in another order on this step only
    (the blind job mp_group_cycle switches its order after warm-up): a cross-group deadlock
    that says the order every rank had kept until then was broken, and by whom."""
    d = check(diagnose(snap(_eval_job(moved_on=False))), "cross-group-deadlock", [3])
    assert d.details["broken_order"]["side"] == [3], d.details
    assert (
        "Until then every rank had issued group '1''s collectives at the same places among group '0''s; rank 3 "
        "broke that order here: it skipped all_reduce seq 3 on group '1' (ranks 0-2 wait in it) and went on into "
        "group '0', or entered the groups in another order on this step only."
    ) in d.summary, d.summary
    assert "an exception caught and passed over (`except ...: continue`)" in d.summary


def test_groups_entered_in_opposite_orders_the_first_time_they_meet_stay_a_deadlock():
    """No earlier collective of the eval group: nothing agreed, so nothing broken."""
    d = diagnose(snap(_eval_job(agreed_evals=0, moved_on=False)))
    assert d.kind == "cross-group-deadlock" and d.culprit_ranks == [3], d.summary
    assert "broken_order" not in d.details


def test_an_even_split_or_an_order_that_differed_before_stays_a_deadlock():
    b = ranks(4, steps=1, groups=G)
    for x in b:
        x.coll("0", n=4)
        x.coll("1")
    for x in b:
        if x.rank in (2, 3):
            x.wait("0")
        else:
            x.wait("1")
    d = diagnose(snap(b))
    assert d.kind == "cross-group-deadlock" and "broken_order" not in d.details, d.summary
    d = diagnose(snap(_eval_job(early=3, moved_on=False)))
    assert d.kind == "cross-group-deadlock" and "broken_order" not in d.details, d.summary
