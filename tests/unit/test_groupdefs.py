"""Ranks that created their process groups in another order (analyze/graph/groupdefs.py).

Blind helper 101 (2026-12-04, torchrun, 4 ranks, gloo): rank 3 read a per-node flag and created
the data-parallel groups ([0,2], [1,3]) before the tensor-parallel ones ([0,1], [2,3]); torch
names groups by a counter, so group '4' was [2,3] on rank 3 and [1,3] on rank 1. gloo aborted
rank 3 (its 4 floats against rank 1's 9) and the verdict said "rank 3 issued all_reduce with a
different size"; with the sizes the other way round it named rank 1; with equal sizes the job
ran on with wrong sums and the verdict was "Progressing"."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from synth import R, group, snap, world  # noqa: E402

from hangtrace.tracer.analyze.diagnose import diagnose  # noqa: E402
from hangtrace.tracer.report.advice import GROUP_ORDER_NEXT  # noqa: E402

TP, DP = ([0, 1], [2, 3]), ([0, 2], [1, 3])


def _groups(rank, dp_first):
    """What ``rank`` records: every new_group call in its order; it has a name only where it is a member."""
    out = [world(4)]
    for i, members in enumerate((DP + TP) if dp_first else (TP + DP), start=1):
        g = group(str(i), members, order=i)
        if rank not in members:
            g["name"] = None
        out.append(g)
    return out


def _job(swapped=(3,), sizes=(4, 9)):
    """Four ranks; those in ``swapped`` created DP before TP. Each did an all_reduce on its 'TP'
    group; on group '4' (rank 1's DP [1,3], rank 3's TP [2,3]) rank 3 sent ``sizes[0]`` floats
    and rank 1 ``sizes[1]``."""
    b = []
    for r in range(4):
        x = R(r, 4, groups=_groups(r, r in swapped))
        x.coll("0", n=2)
        mine = [g for g in x.groups if g.get("name") and g["order"] > 0]
        for g in mine:
            n = sizes[0] if (r, g["name"]) == (3, "4") else sizes[1] if (r, g["name"]) == (1, "4") else 4
            x.coll(g["name"], numel=n)
        b.append(x)
    return b


def test_the_rank_that_created_its_groups_in_another_order_is_named_with_the_group_it_disagrees_on():
    d = diagnose(snap(_job()))
    assert (d.kind, d.cause, d.culprit_ranks) == ("collective-mismatch", "mismatch", [3]), d.summary
    go = d.details["group_order"]
    assert go["culprit_order"] == [[0, 2], [1, 3], [0, 1], [2, 3]] and go["majority"] == [0, 1, 2]
    assert "rank 3 created its process groups in another order than ranks 0-2" in d.summary
    assert (
        "is [2,3] on rank 3 but [1,3] on rank 1" in d.summary
        or "is [1,3] on rank 3 but [2,3] on rank 2" in d.summary
    ), d.summary
    assert "Next: " + GROUP_ORDER_NEXT in d.summary


def test_the_same_order_everywhere_is_no_finding():
    d = diagnose(snap(_job(swapped=())))
    assert "group_order" not in d.details, d.summary


def test_groups_named_by_their_members_never_disagree():
    """``new_group(..., use_local_synchronization=True)``: only members call it, and its name
    is a hash of its members: orders differ between ranks, names never disagree."""
    b = []
    for r in range(4):
        gs = [world(4)] + [
            group("h%s" % "".join(map(str, m)), m, order=i + 1)
            for i, m in enumerate(m for m in TP + DP if r in m)
        ]
        x = R(r, 4, groups=gs)
        x.coll("0", n=2)
        b.append(x)
    d = diagnose(snap(b))
    assert "group_order" not in d.details, d.summary
