"""Issue 2: records of real gloo jobs agree across ranks; SIGKILL leaves a readable record."""

import glob
import os
import signal

import pytest

from jobs import finished_ranks, kill_all, start_ranks, wait_line, wait_until
from hangtrace.tracer.ring import reader as R
from hangtrace.tracer.collect.rings import load_run

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, "scripts")


def _coll(p):
    return [
        (r["group"], r["seq"], r["op"], r["numel"], r["dtype"], r["state"])
        for r in p.records
        if r["kind"] == "collective"
    ]


@pytest.mark.parametrize("world_size", [2, 4])
def test_records_agree_across_ranks(tmp_path, world_size):
    ranks = finished_ranks(os.path.join(SCRIPTS, "collectives.py"), world_size, tmp_path)
    assert sorted(ranks) == list(range(world_size))
    # world-group collectives: identical (group, seq, op, size) sequence on every rank
    world = {r: [c for c in _coll(p) if c[0] == "0"] for r, p in ranks.items()}
    assert all(world[r] == world[0] for r in ranks)
    ops = [c[2] for c in world[0]]
    assert ops[:5] == ["all_reduce", "all_reduce", "all_gather", "broadcast", "all_gather_object"]
    assert [c[1] for c in world[0]] == list(range(1, len(world[0]) + 1))
    assert all(c[5] == "completed" for c in world[0])
    # all_gather_object's inner all_gather calls are not counted twice: 6 per step + barrier
    assert len(world[0]) == 3 * 5 + 1
    # async op recorded as async and completed
    asyncs = [r for r in ranks[0].records if r["kind"] == "collective" and r["async_op"]]
    assert len(asyncs) == 3 and all(r["state"] == "completed" and r["shape"] == "2x3" for r in asyncs)
    # subgroup: pair members agree, others do not see it
    for i in range(0, world_size - 1, 2):
        a = [c for c in _coll(ranks[i]) if c[0] != "0"]
        b = [c for c in _coll(ranks[i + 1]) if c[0] != "0"]
        assert a == b and len(a) == 3 and a[0][4] == "float64"
        g = [g for g in ranks[i].groups if g.get("name") == a[0][0]][0]
        assert g["ranks"] == [i, i + 1] and g["backend"] == "gloo"
    # groups recorded in creation order on every rank, non-members included
    for p in ranks.values():
        assert [g["order"] for g in p.groups] == list(range(1 + world_size // 2))
        assert p.groups[0]["desc"] == "default_pg" and p.groups[0]["ranks"] == list(range(world_size))
    # p2p: send #k of rank i to j pairs with recv #k of j from i (seq per (group, peer))
    for r, p in ranks.items():
        peer = r ^ 1
        mine = [(x["op"], x["seq"]) for x in p.records if x["kind"] == "p2p"]
        theirs = [(x["op"], x["seq"]) for x in ranks[peer].records if x["kind"] == "p2p"]
        swap = {"send": "recv", "recv": "send", "isend": "irecv", "irecv": "isend"}
        assert sorted((swap[o], s) for o, s in mine) == sorted(theirs)
        assert all(x["peer"] == peer and x["state"] == "completed" for x in p.records if x["kind"] == "p2p")
        batch = [x for x in p.records if x["kind"] == "p2p" and x["batch"]]
        assert len(batch) == 6
    for p in ranks.values():
        assert p.state == "exited" and p.exit_code == 0
        steps = {r["step"] for r in p.records if r["kind"] == "collective" and r["phase"] == "train"}
        assert steps == {0, 1, 2}


KILL_SCRIPT = r"""
import os, sys, time, torch, torch.distributed as dist
from hangtrace import tracer
rank = int(os.environ["RANK"])
dist.init_process_group("gloo")
dist.all_reduce(torch.ones(1))
tracer.step(5)
with tracer.phase("train"):
    if rank == 1:
        print("entering", flush=True)
        dist.all_reduce(torch.ones(7))   # rank 0 never joins
    else:
        print("waiting", flush=True)
        time.sleep(600)
"""


def test_sigkill_mid_collective_is_readable(tmp_path):
    script = tmp_path / "kill.py"
    script.write_text(KILL_SCRIPT)
    run = tmp_path / "run"
    procs = start_ranks(script, 2, run)
    try:
        wait_line(procs[1], "entering")
        ring = lambda: [p for p in glob.glob(str(run / "ring-*.htr"))]

        def inflight():
            for path in ring():
                r = R.read_ring(path)
                if r.header["rank"] == 1 and r.header["inflight_idx"]:
                    return r

        wait_until(inflight)
        procs[1].send_signal(signal.SIGKILL)
        procs[1].wait(timeout=10)
    finally:
        kill_all(procs)
    snap = load_run(str(run))
    p1 = [p for p in snap.processes if p.rank == 1][0]
    assert p1.state == "killed"
    assert p1.phase == "train" and p1.step == 5
    assert p1.inflight is not None
    assert (p1.inflight["op"], p1.inflight["numel"], p1.inflight["seq"], p1.inflight["state"]) == (
        "all_reduce",
        7,
        2,
        "issued",
    )
    assert p1.records[-1] is p1.inflight or p1.records[-1]["idx"] == p1.inflight["idx"]
