"""Rule deadlock: a cycle of waits over two or more groups (cross-group-deadlock / cycle)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ruleutil import check  # noqa: E402
from synth import group, ranks, snap, world  # noqa: E402

from hangtrace.tracer.analyze.diagnose import diagnose  # noqa: E402


def _ab_groups(n):
    return [world(n), group("A", [0, 1], order=1), group("B", [0, 1], order=2)]


def _cp_dp_groups(descs=True):
    """World 4: CP {0,1},{2,3} (cp0, cp1), DP {0,2},{1,3} (dp0, dp1), created in that order."""
    d = (lambda x: x) if descs else (lambda x: "undefined")
    return [
        world(4),
        group("1", [0, 1], desc=d("cp0"), order=1),
        group("2", [2, 3], desc=d("cp1"), order=2),
        group("3", [0, 2], desc=d("dp0"), order=3),
        group("4", [1, 3], desc=d("dp1"), order=4),
    ]


def test_cross_group_cycle_two_ranks():
    g = _ab_groups(2)
    b = ranks(2, groups=g)
    for x in b:
        x.coll("A", n=2)
        x.coll("B", n=2)
    b[0].wait("A")  # rank 0 enters A first
    b[1].wait("B")  # rank 1 enters B first
    d = check(diagnose(snap(b)), "cross-group-deadlock", [0, 1])
    assert d.details["cycle"]["groups"] == ["A", "B"]
    assert d.details["cycle"]["ranks"] == [0, 1]
    assert d.group in ("A", "B") and d.seq == 3


def test_cross_group_cycle_minority_named():
    g = [world(4), group("dp", range(4), desc="data_parallel")]
    b = ranks(4, groups=g)
    for x in b:
        x.coll("dp", n=1)
    b[0].wait("0", op="barrier")  # rank 0 only: checkpoint barrier on world
    for r in (1, 2, 3):
        b[r].wait("dp")  # the rest went on to the next DP all_reduce
    d = check(diagnose(snap(b)), "cross-group-deadlock", [0])
    assert d.details["cycle"]["ranks"] == [0, 1, 2, 3]
    assert d.op == "barrier" and d.group == "0"


def test_cp_layout_genuine_cycle_stays_deadlock():
    """Same CP/DP mesh, every rank issues the same number of collectives per group, but
    ranks enter CP and DP in different orders: 0 waits in cp0 for 1, 1 in dp1 for 3,
    3 in cp1 for 2, 2 in dp0 for 0. CP counts are 3,2,2,3: no majority -> a deadlock."""
    g = _cp_dp_groups()
    b = ranks(4, groups=g)
    cp = {0: "1", 1: "1", 2: "2", 3: "2"}
    dp = {0: "3", 1: "4", 2: "3", 3: "4"}
    for x in b:
        x.coll(cp[x.rank], n=2)
        x.coll(dp[x.rank], n=2)
    b[0].wait(cp[0])
    b[1].wait(dp[1])
    b[3].wait(cp[3])
    b[2].wait(dp[2])
    d = check(diagnose(snap(b)), "cross-group-deadlock", [0, 1, 2, 3])
    assert d.details["cycle"]["ranks"] == [0, 1, 2, 3]
    assert "extra_collective" not in d.details


def test_two_rank_cycle_same_counts_stays_deadlock_with_role_groups():
    """Two ranks, groups A and B both {0,1} (not a partition: no role), each rank has
    issued the same number on both; they enter A and B in opposite orders."""
    g = [world(2), group("A", [0, 1], desc="a0", order=1), group("B", [0, 1], desc="a1", order=2)]
    b = ranks(2, groups=g)
    for x in b:
        x.coll("A", n=3)
        x.coll("B", n=3)
    b[0].wait("A")
    b[1].wait("B")
    check(diagnose(snap(b)), "cross-group-deadlock", [0, 1])


def test_minority_side_counts_every_waiter_of_its_instance():
    """3 ranks; group A = {0,1,2}, group B = {0,1}; rank 1 entered B first while ranks 0
    and 2 entered A first: the cycle is 0 <-> 1, but rank 2 waits beside rank 0, so rank 1
    alone took the other order (blind job mp_group_cycle)."""
    from synth import R, group, snap, world
    from hangtrace.tracer.analyze.diagnose import diagnose

    gs = [world(3), group("A", [0, 1, 2], "gA", 1), group("B", [0, 1], "gB", 2)]
    b = [R(r, 3, groups=gs) for r in range(3)]
    for x in b:
        x.coll("0", n=2)
    b[0].wait("A")
    b[2].wait("A")
    b[1].wait("B")
    d = diagnose(snap(b))
    assert (d.kind, d.culprit_ranks) == ("cross-group-deadlock", [1]), d.summary
    assert d.details["cycle"]["ranks"] == [0, 1]
