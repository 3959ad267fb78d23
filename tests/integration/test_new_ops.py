"""The collective and p2p functions torch 2.13 added to what we record (issue 10), on a real
2-rank gloo job: each is recorded once, with its op name and payload, agreeing across ranks.
All of them run on gloo (torch 2.13 CPU); none is skipped."""

import os
from typing import Any, Dict, List, Tuple

import pytest

from jobs import finished_ranks
from hangtrace.tracer import config

pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
NEW = (
    "all_gather_single",
    "reduce_scatter_single",
    "all_gather_coalesced",
    "all_reduce_coalesced",
    "send_object_list",
    "recv_object_list",
)


def _sig(r: Dict[str, Any]) -> Tuple[Any, ...]:
    return (r["group"], r["seq"], r["op"], r["numel"], r["shape"], r["dtype"], r["async_op"], r["state"])


@pytest.mark.skipif(not all(hasattr(dist, n) for n in NEW), reason="torch before 2.13")
@pytest.mark.parametrize("pure", ["0", "1"], ids=["c", "py"])  # the C wrappers, the Python ones
def test_new_ops_recorded_on_gloo(tmp_path: Any, pure: str) -> None:
    ranks = finished_ranks(
        os.path.join(HERE, "scripts", "new_ops.py"), 2, tmp_path, **{config.PURE_PYTHON: pure}
    )
    assert sorted(ranks) == [0, 1]
    coll: Dict[int, List[Tuple[Any, ...]]] = {
        r: [_sig(x) for x in p.records if x["kind"] == "collective"] for r, p in ranks.items()
    }
    # the same sequence on both ranks (all_gather_into_tensor's inner all_gather_single
    # is not counted: one user call, one record, one seq)
    assert coll[0] == coll[1]
    assert coll[0] == [
        ("0", 1, "all_gather_single", 4, "4", "float32", False, "completed"),
        ("0", 2, "reduce_scatter_single", 6, "6", "float64", False, "completed"),
        ("0", 3, "all_gather_coalesced", 5, "2", "float32", False, "completed"),
        ("0", 4, "all_reduce_coalesced", 13, "2x5", "float32", False, "completed"),
        ("0", 5, "all_reduce_coalesced", 6, "6", "int64", False, "completed"),
        ("0", 6, "all_reduce_coalesced", 7, "7", "float32", True, "completed"),  # async: a Future
        ("0", 7, "all_gather_into_tensor", 2, "2", "float32", False, "completed"),
        ("0", 8, "barrier", 0, None, "", False, "completed"),
    ]
    p2p = {
        r: [
            (x["op"], x["seq"], x["peer"], x["numel"], x["dtype"], x["batch"], x["state"])
            for x in p.records
            if x["kind"] == "p2p"
        ]
        for r, p in ranks.items()
    }
    # one record per object-list call (its inner send/recv or batch_isend_irecv calls are
    # not recorded): the (group, peer) counter matches the peer's, so the plain send
    # after them pairs with the plain recv
    assert p2p[0] == [
        ("send_object_list", 1, 1, 3, "object", False, "completed"),
        ("send_object_list", 2, 1, 1, "object", False, "completed"),
        ("send", 3, 1, 5, "float32", False, "completed"),
    ]
    assert p2p[1] == [
        ("recv_object_list", 1, 0, 3, "object", False, "completed"),
        ("recv_object_list", 2, 0, 1, "object", False, "completed"),
        ("recv", 3, 0, 5, "float32", False, "completed"),
    ]
    for p in ranks.values():
        assert p.state == "exited" and p.exit_code == 0
