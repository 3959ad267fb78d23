"""A pipeline whose stage 2 posts its backward irecv from rank 1 instead of rank 3 (blind
helper 63): every stage waits in ``req.wait()`` on an async irecv (C++: no torch frame on
the stack), so the index first saw no rank blocked at all ("not in any collective")."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ruleutil import check  # noqa: E402
from synth import ranks, snap, stack  # noqa: E402

from hangtrace.tracer.analyze.diagnose import diagnose  # noqa: E402

WAIT = ("train_step /job/pp_job.py:100", "worker /job/pp_job.py:133")


def _waits_at_req_wait(b, code="req.wait()"):
    s = stack(*WAIT, active=False)
    s[0].update(kernel={"syscall": "futex", "args": []})
    s[0]["frames"][0]["code"] = code
    b.set(stacks=s, stack_source="py-spy")


def _pipeline(stage2_recv_from=1):
    b = ranks(4, steps=1)
    for mb in range(4):  # forward: 0 -> 1 -> 2 -> 3
        b[0].p2p("0", 1, "isend", async_op=True)
        b[1].p2p("0", 0, "irecv", async_op=True)
        b[1].p2p("0", 2, "isend", async_op=True)
        b[2].p2p("0", 1, "irecv", async_op=True)
        b[2].p2p("0", 3, "isend", async_op=True)
        b[3].p2p("0", 2, "irecv", async_op=True)
    for _ in range(4):  # backward: rank 3 sends its gradients to rank 2, which never receives them
        b[3].p2p("0", 2, "isend", async_op=True, state="issued")
    b[3].wait("0", op="all_reduce")
    b[2].p2p("0", stage2_recv_from, "irecv", async_op=True, state="issued")
    b[1].p2p("0", 2, "irecv", async_op=True, state="issued")
    b[0].p2p("0", 1, "irecv", async_op=True, state="issued")
    for r in (0, 1, 2):
        _waits_at_req_wait(b[r])
    b[3].set(
        stacks=stack(
            "all_reduce /site-packages/torch/distributed/distributed_c10d.py:2500",
            "train_step /job/pp_job.py:112",
            active=False,
        ),
        stack_source="py-spy",
    )
    return b


def test_a_rank_in_req_wait_on_its_async_irecv_is_blocked_in_it_and_the_wrong_peer_is_named():
    d = check(diagnose(snap(_pipeline(), reason="stall")), "collective-mismatch", [2])
    assert d.details["p2p_pair"] == [1, 2]
    assert d.summary.startswith("Collective mismatch (p2p): rank 2 and its peer rank 1 both posted irecv"), (
        d.summary
    )
    assert (
        "Rank 3 sends to rank 2 (its isends up to pair seq 8 on group '0'" in d.summary
        and "rank 2 receives from rank 1 instead, most likely the wrong peer" in d.summary
    ), d.summary
    assert "Next: check the peer of each send and recv of the named rank" in d.summary


def test_an_async_op_is_no_wait_while_the_stack_is_not_in_a_wait_call():
    b = _pipeline()
    for r in (0, 1, 2):
        _waits_at_req_wait(b[r], code="time.sleep(1)")
    d = diagnose(snap(b, reason="stall"))
    assert d.kind == "stuck-outside-collective" and d.culprit_ranks == [0, 1, 2], (d.kind, d.summary)
