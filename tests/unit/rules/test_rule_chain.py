"""Rule chain: the ranks at the end of the wait chains, classified (skipped / stuck outside / dead)."""

import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ruleutil import QUEUE_GET, check  # noqa: E402
from synth import COLL_STACK, MS, T0, R, S, group, ranks, snap, stack, world  # noqa: E402

from hangtrace.tracer.analyze.diagnose import diagnose  # noqa: E402


def test_two_rank_skipped_moved_on():
    b = ranks(2)
    b[0].wait()
    b[1].mark(step=1)
    b[1].mark(phase="eval")
    d = check(diagnose(snap(b)), "skipped-collective", [1])
    assert (d.group, d.seq, d.op) == ("0", 4, "all_reduce")
    assert d.waiting_ranks == [0]
    assert d.group_ranks == [0, 1]
    assert (d.phase, d.step) == ("eval", 1)
    assert any("rank 1: last all_reduce" in e and "seq 3 completed" in e for e in d.evidence)


def test_two_rank_exited_cleanly_is_skipped():
    b = ranks(2)
    b[0].wait()
    b[1].set(state="exited", exit_code=0)
    d = check(diagnose(snap(b)), "skipped-collective", [1])
    assert "exited cleanly" in d.details["culprit_reasons"]["1"]


def test_stuck_outside_queue_get():
    b = ranks(4, steps=5)
    for r in (0, 1, 3):
        b[r].wait()
        b[r].set(stacks=stack(*COLL_STACK, active=False))
    b[2].set(
        stacks=stack(*QUEUE_GET, active=False, extra_threads=[("hangtrace-watch", ["loop watcher.py:5"])])
    )
    d = check(diagnose(snap(b)), "stuck-outside-collective", [2])
    assert d.frames[0] == "get (queue.py:171)"
    assert (d.group, d.seq) == ("0", 6)
    assert d.waiting_ranks == [0, 1, 3]
    assert "queue" in d.details["culprit_reasons"]["2"]
    # stack classes: the queue.get rank is its own (outlier-sized) class
    cls = {tuple(c["ranks"]): c for c in d.stack_classes}
    assert (2,) in cls and (0, 1, 3) in cls
    assert d.details["missing_from_common_frame"]["missing"] == [2]


def test_stuck_outside_without_stack_no_progress():
    b = ranks(3)
    b[0].wait()
    b[1].wait()
    d = check(diagnose(snap(b)), "stuck-outside-collective", [2])
    assert d.cause == "no-progress"


def test_wrapper_frames_hidden_from_displayed_frames():
    b = ranks(2)
    b[0].wait()
    b[0].set(
        stacks=stack(
            "all_reduce /site-packages/torch/distributed/distributed_c10d.py:3252",
            "wrapper /site-packages/torch/distributed/c10d_logger.py:83",
            "_make_wrapper.<locals>.wrapper /opt/site-packages/hangtrace/hooks/torchdist/torch_dist.py:177",
            "train_step train.py:40",
            "main train.py:90",
            active=False,
        )
    )
    b[1].set(stacks=stack(*QUEUE_GET, active=False))
    d = check(diagnose(snap(b)), "stuck-outside-collective", [1])
    assert d.frames[:3] == ["get (queue.py:171)", "next_batch (loader.py:22)", "train_step (train.py:38)"]
    from hangtrace.tracer.stackmodel.usercode import wrapper_frame as _wrapper_frame

    assert _wrapper_frame(
        {"name": "_make_wrapper.<locals>.wrapper", "filename": "/x/hangtrace/hooks/torchdist/torch_dist.py"}
    )
    assert _wrapper_frame(
        {"name": "_exception_logger.<locals>.wrapper", "filename": "/s/torch/distributed/c10d_logger.py"}
    )
    assert not _wrapper_frame({"name": "all_reduce", "filename": "/s/torch/distributed/distributed_c10d.py"})


def test_chain_across_groups_to_end_rank():
    g = [world(8), group("tp0", range(4)), group("tp1", range(4, 8)), group("x", [3, 6])]
    b = ranks(8, groups=g)
    for x in b:
        x.coll("tp0" if x.rank < 4 else "tp1", n=4)
    b[3].coll("x", n=1)
    b[6].coll("x", n=1)
    for r in (0, 1, 2):
        b[r].wait("tp0")  # wait for rank 3
    b[3].wait("x")  # rank 3 waits for rank 6 in group x
    for r in (4, 5, 7):
        b[r].wait("tp1")  # wait for rank 6
    b[6].set(stacks=stack(*QUEUE_GET))  # rank 6 is stuck in queue.get
    d = check(diagnose(snap(b)), "stuck-outside-collective", [6])
    chain = [e for e in d.evidence if e.startswith("wait chain")]
    assert (
        chain
        and "rank 3 waits in group 'x'" in chain[0]
        and chain[0].endswith("rank 6 (not in a collective)")
    )
    assert d.waiting_ranks == [0, 1, 2, 3, 4, 5, 7]


def test_timeout_failures_still_name_stuck_rank():
    b = ranks(3)
    for r in (0, 1):
        b[r].coll(state="failed", error="Timed out waiting 1800000ms for recv operation to complete")
    b[2].set(stacks=stack(*QUEUE_GET))
    d = check(diagnose(snap(b)), "stuck-outside-collective", [2])
    assert sorted(c["rank"] for c in d.cascade) == [0, 1]


def test_p2p_unmatched_send_names_peer():
    b = ranks(2)
    for _ in range(3):
        b[0].p2p("0", 1, "send")
        b[1].p2p("0", 0, "recv")
    b[0].p2p("0", 1, "send", state="issued")  # pair seq 4: rank 1 never posts the recv
    b[1].mark(step=1)
    d = check(diagnose(snap(b)), "skipped-collective", [1])
    assert d.seq == 4 and d.op == "send"


def test_1024_ranks_tp_dp_one_culprit():
    n, tp = 1024, 8
    groups = (
        [world(n)]
        + [group("tp%d" % i, range(i * tp, (i + 1) * tp), desc="tp") for i in range(n // tp)]
        + [group("dp%d" % j, range(j, n, tp), desc="dp") for j in range(tp)]
    )
    bs = []
    culprit = 517
    for r in range(n):
        x = R(r, n, groups=groups)
        tpg, dpg = "tp%d" % (r // tp), "dp%d" % (r % tp)
        for step in range(5):
            x.mark(step=step)
            x.coll(tpg)
            x.coll(dpg)
        if r == culprit:
            x.set(stacks=stack(*QUEUE_GET))
        elif r // tp == culprit // tp:
            x.wait(tpg)  # TP mates wait for the culprit
        else:
            x.coll(tpg)
            x.wait(dpg)  # everyone else waits in DP
        bs.append(x)
    d = check(diagnose(snap(bs)), "stuck-outside-collective", [culprit])
    assert d.group == "tp64" and d.seq == 6
    assert len(d.waiting_ranks) == n - 1


def test_incomplete_snapshot_still_names_culprit():
    b = ranks(8)
    for r in range(8):
        if r != 3:
            b[r].wait()
    b[3].set(stacks=stack(*QUEUE_GET))
    procs = [x.build() for x in b if x.rank not in (5, 6)]
    s = snap(procs, errors=["ring-h0-1005.htr: truncated", "ring-h0-1006.htr: foreign file"])
    d = check(diagnose(s), "stuck-outside-collective", [3])
    assert d.details["missing_ranks"] == [5, 6]
    assert any("5-6" in e and "no record file" in e for e in d.evidence)
    assert d.errors == s.errors


def test_ring_wrapped_last_50_records():
    n = 6
    g = [world(n), group("tp", range(n))]
    b = [R(r, n, groups=g) for r in range(n)]
    for x in b:
        for step in range(200):
            x.mark(step=step)
            x.coll("tp")
            x.coll("0")
    for r in range(n):
        if r != 4:
            b[r].wait("tp")
    b[4].mark(step=200)
    b[4].mark(phase="eval")
    procs = [x.build(keep_last=50) for x in b]
    assert all(p.records[0]["idx"] > 500 for p in procs)
    d = check(diagnose(snap(procs)), "skipped-collective", [4])
    assert d.seq == 201 and d.group == "tp"


def test_duplicate_rank_uses_later_process():
    b = ranks(2)
    b[0].wait()
    old = R(1, 2, pid=999)
    old.coll(n=1)
    oldp = dataclasses.replace(old.build(), start_wall_ns=T0 - 100 * S, state="exited", exit_code=0)
    b[1].set(stacks=stack(*QUEUE_GET))
    d = check(diagnose(snap([oldp] + [x.build() for x in b])), "stuck-outside-collective", [1])
    assert any("rank 1: restarted" in e for e in d.evidence), d.evidence


def test_unranked_processes_ignored():
    b = ranks(2)
    b[0].wait()
    b[1].set(stacks=stack(*QUEUE_GET))
    drv = R(-1, -1, groups=[])
    s = snap([drv.build()] + [x.build() for x in b])
    check(diagnose(s), "stuck-outside-collective", [1])


def test_dead_producer_thread_reported():
    b = ranks(2)
    b[0].wait()
    b[1].set(
        stacks=stack(*QUEUE_GET),
        events=[
            {
                "event": "thread_exception",
                "thread": "loader",
                "type": "IOError",
                "message": "no such file",
                "wall_ns": T0,
            }
        ],
    )
    d = check(diagnose(snap(b)), "stuck-outside-collective", [1])
    assert any("thread loader died" in e for e in d.evidence)


def test_stuck_rank_whose_method_raised_is_named_with_its_exception():
    """Blind job ray_trainer_raise: the trainer actor's train_step raised ValueError; Ray
    keeps the actor alive and idle while its peer waits in all_reduce. Stuck outside
    collectives, and the paragraph says it stopped after that exception."""
    from synth import R, snap
    from hangtrace.tracer.analyze.diagnose import diagnose

    r0, r1 = R(0, 2), R(1, 2)
    for b in (r0, r1):
        b.coll(n=3)
    r0.phase = "train_step"
    r0.mark("phase_enter")
    x = r0.mark("phase_exit")
    x.update(state="failed", error="ValueError: loss is NaN at step 4")
    r0.phase = None
    r1.t = r0.t + 1000  # rank 1 enters the all_reduce after that,
    r1.phase = "train_step"  # inside its own train_step
    r1.wait()
    d = diagnose(snap([r0, r1]))
    assert (d.kind, d.culprit_ranks) == ("stuck-outside-collective", [0]), d.summary
    assert "ValueError: loss is NaN" in d.details["after_exception"]
    assert "It stopped after an exception" in d.summary and "ValueError" in d.summary, d.summary


def test_the_evidence_says_when_the_waiters_seq_and_the_culprits_count_differently():
    # the culprit held the GIL, so it left no Flight Recorder dump: its newest record is our
    # count of Python calls (23), the waiter's is torch's (49, DDP's C++ all-reduces included)
    r0, r1 = R(0, 2), R(1, 2)
    r0.coll("0", n=23)
    r1.coll("0", n=23)
    rec = r0.wait("0", op="barrier", seq=49)
    rec["source"] = "flight-recorder"
    r1.set(stacks=stack("save_shard train.py:37", "main train.py:80", active=False), stack_source="py-spy")
    d = check(diagnose(snap([r0, r1])), "stuck-outside-collective", [1])
    line = next(e for e in d.evidence if e.startswith("rank 1: last all_reduce"))
    assert "seq 23" in line and "rank 0 waits at seq 49 (barrier)" in line, line
    assert line.endswith("rank 1's is hangtrace's count of Python calls: the two do not compare)"), line
    rec["source"] = None  # the same count on both sides: no note
    d = check(diagnose(snap([r0, r1])), "stuck-outside-collective", [1])
    assert not any("do not compare" in e for e in d.evidence), d.evidence


def test_a_rank_running_outside_collectives_in_a_stall_is_busy_not_moved_on():
    """Blind helper 65: rank 1 spins in a pure-Python packing loop (py-spy: its main thread
    active) after entering phase 'pack' of step 40, while ranks 0 and 2 wait for it in the
    all-reduce; the verdict was "Skipped collective ... moved on" with advice for a skip."""
    b = ranks(3, steps=5)
    for r in (0, 2):
        b[r].wait()
        b[r].set(stacks=stack(*COLL_STACK, active=False), stack_source="py-spy")
    b[1].mark(phase="pack")  # after the others began waiting
    s = stack(
        "Tensor.__len__ /site-packages/torch/_tensor.py:1184",
        "pack_sequences /job/job.py:66",
        "main /job/job.py:127",
        active=True,
    )
    s[0]["frames"][1].update(code="n = len(seqs[idx])", loop=[64, "while remaining:"])
    b[1].set(stacks=s, stack_source="py-spy")
    d = check(diagnose(snap(b, reason="stall")), "stuck-outside-collective", [1])
    assert d.cause == "busy", d.cause
    assert (
        "busy on the CPU outside collectives (py-spy: running) and making no progress" in d.summary
        and "in pack_sequences (job.py:66): `n = len(seqs[idx])`, inside `while remaining:` (job.py:64)"
        in d.summary
    ), d.summary
    assert "Next: the rank is running, not waiting" in d.summary
    # a later step than the waiters' is still a skip, running or not
    b[1].mark(step=6)
    assert diagnose(snap(b, reason="stall")).kind == "skipped-collective"


def test_ranks_that_failed_with_a_transport_error_are_victims_not_chain_ends():
    """Rank 0 waits at seq 4; ranks 1 and 3 raised 'Connection closed by peer' (transport
    victims, exited 1); rank 2 exited cleanly without seq 4. The chain ends at rank 2 alone:
    the victims are neither culprits nor "moved on" members that make rank 0 the minority."""
    b = ranks(4)
    b[0].wait()
    for r in (1, 3):
        b[r].set(
            state="exited",
            exit_code=1,
            phase=None,
            events=[
                {
                    "event": "exception",
                    "type": "RuntimeError",
                    "wall_ns": b[0].t + 2 * S,
                    "message": "[pair.cc:553] Connection closed by peer [127.0.0.1]:1234",
                },
                {"event": "exiting", "threads": [], "more": 0, "wall_ns": b[0].t + 2 * S + MS},
            ],
        )
    b[2].set(
        state="exited",
        exit_code=0,
        phase=None,
        exit_wall_ns=b[0].t + 3 * S,
        events=[{"event": "exiting", "threads": [], "more": 0, "wall_ns": b[0].t + 3 * S}],
    )
    d = check(diagnose(snap(b)), "skipped-collective", [2])
    assert d.cause == "skipped" and d.waiting_ranks == [0], (d.cause, d.waiting_ranks)
    assert "exited cleanly (code 0)" in d.details["culprit_reasons"]["2"]
