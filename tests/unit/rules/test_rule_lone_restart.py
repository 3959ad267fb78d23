"""A rank restarted alone (a Ray actor's ``max_restarts``): the process that died stands
for the rank, and its replacement's wait is described (blind helper 73: trainer 1 of 2
SIGKILLed in step 5, restarted by Ray; the new process hung in ``init_process_group`` in its
``__init__`` while trainer 0's all_reduce had failed and it served the driver's calls)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ruleutil import check  # noqa: E402
from synth import S, T0, R, snap, stack, world  # noqa: E402

from hangtrace.tracer.analyze.diagnose import diagnose  # noqa: E402

GLOO = (
    "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed "
    "by peer [127.0.0.1]:33515. This is typically caused by ..."
)
RENDEZVOUS = (
    "_new_process_group_helper /site-packages/torch/distributed/distributed_c10d.py:2169",
    "init_process_group /site-packages/torch/distributed/distributed_c10d.py:1899",
    "__init__ /job/driver.py:17",
)


def _job(restart_peer=False, rejoined=False):
    """Ranks 0-1 run 10 all_reduces; rank 1 is killed in the 11th; rank 0's fails after it.
    Then rank 1 gets a new process (pid 2001): inside init_process_group, or (``rejoined``)
    through an all_reduce with a new rank 0 (``restart_peer``: rank 0 restarted too)."""
    r0 = R(0, 2, groups=[world(2)], pid=1000)
    r1 = R(1, 2, groups=[world(2)], pid=1001)
    for _ in range(10):
        r0.coll()
        r1.coll()
    r1.wait()
    r1.set(state="killed")
    r0.coll(state="failed", error=GLOO)
    r0.t += 5 * S
    r0.set(state="alive", stacks=stack("main_loop /ray/_private/worker.py:900", active=False))
    new = R(1, 2, groups=[world(2)], pid=2001, t0=T0 + 60 * S, phase="__init__")
    new.set(start_wall_ns=T0 + 60 * S)
    procs = [r0, r1, new]
    if rejoined:
        new.coll()
    else:
        new.set(stacks=stack(*RENDEZVOUS))
    if restart_peer:
        r0.set(state="killed", stacks=None)
        again = R(0, 2, groups=[world(2)], pid=2000, t0=T0 + 60 * S, phase="__init__")
        again.set(stacks=stack(*RENDEZVOUS), start_wall_ns=T0 + 60 * S)
        procs.append(again)
    return snap(procs, reason="death", taken=T0 + 70 * S)


def test_a_rank_restarted_alone_is_its_death_and_the_replacement_is_described():
    d = check(diagnose(_job()), "dead-rank", [1])
    assert d.cause == "killed-without-record"
    rep = d.details["replacement"]
    assert rep["pid"] == 2001 and rep["rank"] == 1
    assert (
        rep["text"] == "pid 2001 is in init_process_group (the rendezvous), called at __init__ (driver.py:17)"
    )
    assert (
        "It was restarted alone: its new process pid 2001 is in init_process_group (the rendezvous), called at "
        "__init__ (driver.py:17); the other ranks kept the process group it died in"
    ) in d.summary, d.summary
    assert "restart every rank of the process group together" in d.summary
    assert "It ran in 2 attempts" not in d.summary
    # the cascade: rank 0's all_reduce failed after the death; gloo's source position is not in the paragraph
    assert [c["rank"] for c in d.cascade] == [0]
    assert "rank 0: RuntimeError: Connection closed by peer [127.0.0.1]:33515)" in d.summary, d.summary
    assert any("restarted alone" in e for e in d.evidence)


def test_a_restart_of_every_rank_analyses_the_newest_processes():
    d = diagnose(_job(restart_peer=True))
    assert "replacement" not in d.details
    assert not any("restarted alone" in e for e in d.evidence)


def test_a_replacement_that_rejoined_is_the_rank():
    d = diagnose(_job(rejoined=True))
    assert "replacement" not in d.details
    assert d.kind != "dead-rank" or d.culprit_ranks != [1] or "It was restarted alone" not in d.summary
