"""Rule extra_collective: an apparent cycle explained by one rank's extra collective (skipped-collective / extra-collective)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ruleutil import check  # noqa: E402
from synth import group, ranks, snap, world  # noqa: E402

from hangtrace.tracer.analyze.diagnose import diagnose  # noqa: E402


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


def _cp_extra_microbatch(descs=True):
    """examples/train_faults.py --fault cp-extra-microbatch, as records: rank 1 issues one
    extra CP all_reduce that rank 0 never issues; rank 0 goes on through dp0 into the
    world loss all_reduce with rank 2; rank 3 waits in dp1 for rank 1."""
    g = _cp_dp_groups(descs)
    cp = {0: "1", 1: "1", 2: "2", 3: "2"}
    dp = {0: "3", 1: "4", 2: "3", 3: "4"}
    b = ranks(4, steps=5, groups=g)  # rollout: world all_gathers/all_reduce
    for x in b:
        x.mark(phase="train", step=2)
        x.coll(cp[x.rank], n=10)  # 5 micro-batches x (weight, bias)
    b[1].wait(cp[1])  # rank 1: one micro-batch more
    for r in (0, 2, 3):
        if r != 3:
            b[r].coll(dp[r], n=2)  # DP sync completes for ranks 0 and 2
    b[3].wait(dp[3])  # rank 3 waits for rank 1 in dp1
    b[0].wait("0")  # ranks 0 and 2: world loss all_reduce
    b[2].wait("0")
    return b


@pytest.mark.parametrize("descs", [True, False], ids=["desc", "no-desc"])
def test_cp_extra_microbatch_is_extra_collective_not_deadlock(descs):
    b = _cp_extra_microbatch(descs)
    d = check(diagnose(snap(b)), "skipped-collective", [1])
    assert d.cause == "extra-collective"
    assert (d.group, d.seq, d.op) == ("1", 11, "all_reduce")
    assert d.group_ranks == [0, 1]
    ex = d.details["extra_collective"]
    assert ex["counts"] == {"0": 10, "1": 11, "2": 10, "3": 10} and ex["majority_count"] == 10
    assert ex["peers"] == [0] and ex["other_group_ranks"] == [2, 3]
    assert d.waiting_ranks == [0, 2, 3]
    if descs:
        assert d.details["group_desc"] == "cp0" and ex["role"] == "cp"
        assert (
            "rank 1 issued one more all_reduce on group '1' (cp0) than its peer rank 0 and than "
            "the other cp group(s)' ranks 2-3" in d.summary
        ), d.summary
    assert d.details["cycle"]["explained_by"] == "extra-collective"
