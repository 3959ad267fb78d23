"""diagnose() on synthetic snapshots: every verdict kind, exact kinds and culprit ranks."""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from synth import COLL_STACK, MS, S, T0, R, group, ranks, snap, stack, world  # noqa: E402

from hangtrace.tracer.analyze.diagnose import diagnose, is_transport_error  # noqa: E402
from hangtrace.tracer.diagnosis import KINDS  # noqa: E402
from hangtrace.tracer.report.text import diagnosis_json  # noqa: E402

QUEUE_GET = ("get queue.py:171", "next_batch loader.py:22", "train_step train.py:38",
             "main train.py:90", "<module> train.py:100")


def check(d, kind, culprits):
    assert d.kind in KINDS
    assert (d.kind, d.culprit_ranks) == (kind, culprits), (d.kind, d.culprit_ranks, d.evidence)
    json.dumps(diagnosis_json(d))  # always serialisable
    return d


# --- skipped / stuck outside ------------------------------------------------------------

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
    b[2].set(stacks=stack(*QUEUE_GET, active=False,
                          extra_threads=[("hangtrace-watch", ["loop watcher.py:5"])]))
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


def test_rank0_extra_collective_others_moved_on_minority_named():
    b = ranks(4)
    b[0].wait(op="barrier")
    for r in (1, 2, 3):
        b[r].set(state="exited", exit_code=0)
    d = check(diagnose(snap(b)), "skipped-collective", [0])
    assert d.cause == "extra-collective"
    assert d.op == "barrier"


# --- mismatch -----------------------------------------------------------------------------

def test_four_rank_mismatch_op():
    b = ranks(4)
    for r in (0, 1, 3):
        b[r].wait(op="all_reduce")
    b[2].wait(op="all_gather")
    d = check(diagnose(snap(b)), "collective-mismatch", [2])
    assert d.seq == 4 and d.op == "all_gather"
    sigs = {s["op"]: s["ranks"] for s in d.details["signatures"]}
    assert sigs == {"all_reduce": [0, 1, 3], "all_gather": [2]}
    assert any("all_gather" in e and e.startswith("rank 2 at") for e in d.evidence)


def test_four_rank_mismatch_numel():
    b = ranks(4)
    for r in range(4):
        b[r].wait(numel=1024 if r != 1 else 2048)
    d = check(diagnose(snap(b)), "collective-mismatch", [1])
    assert any("numel=2048" in e for e in d.evidence)


def test_mismatch_tie_names_all():
    b = ranks(2)
    b[0].wait(op="all_reduce")
    b[1].wait(op="broadcast", peer=0)
    d = check(diagnose(snap(b)), "collective-mismatch", [0, 1])
    assert any("no majority" in e for e in d.evidence)


def test_rank0_checkpoint_mismatch_names_both_phases():
    """train_faults --fault rank0-checkpoint: rank 0 alone all_reduces in 'checkpoint' of
    step 3; ranks 1-3 went on to 'rollout' of step 4 and all_gather at the same seq."""
    b = ranks(4)
    b[0].mark(phase="checkpoint", step=3)
    b[0].wait(op="all_reduce")
    for r in (1, 2, 3):
        b[r].mark(phase="rollout", step=4)
        b[r].wait(op="all_gather", dtype="int64", numel=4)
    d = check(diagnose(snap(b)), "collective-mismatch", [0])
    assert (d.op, d.phase, d.step) == ("all_reduce", "checkpoint", 3)
    sig = {x["op"]: (x["phase"], x["step"]) for x in d.details["signatures"]}
    assert sig == {"all_reduce": ("checkpoint", 3), "all_gather": ("rollout", 4)}
    assert "rank 0: all_reduce float32 numel=1 in phase 'checkpoint', step 3" in d.summary, d.summary
    assert "ranks 1-3: all_gather int64 numel=4 in phase 'rollout', step 4" in d.summary, d.summary


def test_rank0_extra_barrier_same_seq_is_mismatch():
    b = ranks(8)
    b[0].wait(op="barrier", dtype="", numel=0)
    for r in range(1, 8):
        b[r].wait(op="all_reduce")
    check(diagnose(snap(b)), "collective-mismatch", [0])


def test_variable_size_ops_not_mismatched():
    b = ranks(2)
    b[0].coll(op="all_gather_object", numel=10, dtype="object")
    b[1].coll(op="all_gather_object", numel=30, dtype="object")
    b[0].wait()
    b[1].wait()
    d = diagnose(snap(b, reason="request", taken=b[1].t + MS))
    assert d.kind == "progressing"


# --- cross-group ----------------------------------------------------------------------------

def _ab_groups(n):
    return [world(n), group("A", [0, 1], order=1), group("B", [0, 1], order=2)]


def test_cross_group_cycle_two_ranks():
    g = _ab_groups(2)
    b = ranks(2, groups=g)
    for x in b:
        x.coll("A", n=2)
        x.coll("B", n=2)
    b[0].wait("A")   # rank 0 enters A first
    b[1].wait("B")   # rank 1 enters B first
    d = check(diagnose(snap(b)), "cross-group-deadlock", [0, 1])
    assert d.details["cycle"]["groups"] == ["A", "B"]
    assert d.details["cycle"]["ranks"] == [0, 1]
    assert d.group in ("A", "B") and d.seq == 3


def test_cross_group_cycle_minority_named():
    g = [world(4), group("dp", range(4), desc="data_parallel")]
    b = ranks(4, groups=g)
    for x in b:
        x.coll("dp", n=1)
    b[0].wait("0", op="barrier")          # rank 0 only: checkpoint barrier on world
    for r in (1, 2, 3):
        b[r].wait("dp")                   # the rest went on to the next DP all_reduce
    d = check(diagnose(snap(b)), "cross-group-deadlock", [0])
    assert d.details["cycle"]["ranks"] == [0, 1, 2, 3]
    assert d.op == "barrier" and d.group == "0"


def _cp_dp_groups(descs=True):
    """World 4: CP {0,1},{2,3} (cp0, cp1), DP {0,2},{1,3} (dp0, dp1), created in that order."""
    d = (lambda x: x) if descs else (lambda x: "undefined")
    return [world(4), group("1", [0, 1], desc=d("cp0"), order=1), group("2", [2, 3], desc=d("cp1"), order=2),
            group("3", [0, 2], desc=d("dp0"), order=3), group("4", [1, 3], desc=d("dp1"), order=4)]


def _cp_extra_microbatch(descs=True):
    """examples/train_faults.py --fault cp-extra-microbatch, as records: rank 1 issues one
    extra CP all_reduce that rank 0 never issues; rank 0 goes on through dp0 into the
    world loss all_reduce with rank 2; rank 3 waits in dp1 for rank 1."""
    g = _cp_dp_groups(descs)
    cp = {0: "1", 1: "1", 2: "2", 3: "2"}
    dp = {0: "3", 1: "4", 2: "3", 3: "4"}
    b = ranks(4, steps=5, groups=g)            # rollout: world all_gathers/all_reduce
    for x in b:
        x.mark(phase="train", step=2)
        x.coll(cp[x.rank], n=10)               # 5 micro-batches x (weight, bias)
    b[1].wait(cp[1])                           # rank 1: one micro-batch more
    for r in (0, 2, 3):
        if r != 3:
            b[r].coll(dp[r], n=2)              # DP sync completes for ranks 0 and 2
    b[3].wait(dp[3])                           # rank 3 waits for rank 1 in dp1
    b[0].wait("0")                             # ranks 0 and 2: world loss all_reduce
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
        assert "rank 1 issued one more all_reduce on group '1' (cp0) than its peer rank 0 and than " \
               "the other cp group(s)' ranks 2-3" in d.summary, d.summary
    assert d.details["cycle"]["explained_by"] == "extra-collective"


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


def test_sigkilled_rank_whose_last_completion_follows_peer_wait_is_dead():
    """kill-rank: rank 1 completes cp seq 6 a little after rank 0 issued seq 7, then is
    SIGKILLed (no record). Its last sign of life is after the wait began, but it issued
    nothing new: dead-rank, not 'moved on'."""
    b = ranks(2)
    b[0].wait()                                   # seq 4 issued at t
    b[1].coll(n=1, seq=3)                         # re-records its seq 3, completing after rank 0's issue
    b[1].records[-1]["t_wall_ns"] = b[0].t - MS // 2
    b[1].records[-1]["t_mono_ns"] = b[1].records[-1]["t_wall_ns"] - T0
    b[1].records[-1]["t_end_mono_ns"] = b[0].t - T0 + MS
    b[1].t = b[0].t + MS                          # progress stamped at that completion
    b[1].set(state="killed")
    d = check(diagnose(snap(b)), "dead-rank", [1])
    assert d.cause == "killed-without-record"


def test_wrapper_frames_hidden_from_displayed_frames():
    b = ranks(2)
    b[0].wait()
    b[0].set(stacks=stack("all_reduce /site-packages/torch/distributed/distributed_c10d.py:3252",
                          "wrapper /site-packages/torch/distributed/c10d_logger.py:83",
                          "_make_wrapper.<locals>.wrapper /opt/site-packages/hangtrace/hooks/torch_dist.py:177",
                          "train_step train.py:40", "main train.py:90", active=False))
    b[1].set(stacks=stack(*QUEUE_GET, active=False))
    d = check(diagnose(snap(b)), "stuck-outside-collective", [1])
    assert d.frames[:3] == ["get (queue.py:171)", "next_batch (loader.py:22)", "train_step (train.py:38)"]
    from hangtrace.tracer.analyze.evidence import wrapper_frame as _wrapper_frame
    assert _wrapper_frame({"name": "_make_wrapper.<locals>.wrapper", "filename": "/x/hangtrace/hooks/torch_dist.py"})
    assert _wrapper_frame({"name": "_exception_logger.<locals>.wrapper",
                           "filename": "/s/torch/distributed/c10d_logger.py"})
    assert not _wrapper_frame({"name": "all_reduce", "filename": "/s/torch/distributed/distributed_c10d.py"})


def test_chain_across_groups_to_end_rank():
    g = [world(8), group("tp0", range(4)), group("tp1", range(4, 8)), group("x", [3, 6])]
    b = ranks(8, groups=g)
    for x in b:
        x.coll("tp0" if x.rank < 4 else "tp1", n=4)
    b[3].coll("x", n=1)
    b[6].coll("x", n=1)
    for r in (0, 1, 2):
        b[r].wait("tp0")                  # wait for rank 3
    b[3].wait("x")                        # rank 3 waits for rank 6 in group x
    for r in (4, 5, 7):
        b[r].wait("tp1")                  # wait for rank 6
    b[6].set(stacks=stack(*QUEUE_GET))    # rank 6 is stuck in queue.get
    d = check(diagnose(snap(b)), "stuck-outside-collective", [6])
    chain = [e for e in d.evidence if e.startswith("wait chain")]
    assert chain and "rank 3 waits in group 'x'" in chain[0] and chain[0].endswith("rank 6 (not in a collective)")
    assert d.waiting_ranks == [0, 1, 2, 3, 4, 5, 7]


# --- dead ranks -----------------------------------------------------------------------------

def test_dead_rank_killed_first_then_connection_closed_cascade():
    b = ranks(4, steps=5)
    b[2].set(state="killed")                 # SIGKILL: no record of it, last sign of life
    for r in (0, 1, 3):
        b[r].t += 2 * S
        b[r].coll(state="failed", error="[../gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]:1234")
        b[r].set(state="exited", exit_code=1,
                 events=[{"event": "exception", "type": "RuntimeError", "wall_ns": b[r].t + MS,
                          "message": "Connection closed by peer [10.0.0.2]:1234"}])
    d = check(diagnose(snap(b)), "dead-rank", [2])
    assert d.cause == "killed-without-record"
    assert sorted(c["rank"] for c in d.cascade) == [0, 1, 3]
    assert all(c["victim"] for c in d.cascade)
    assert d.group == "0" and d.seq == 6


@pytest.mark.parametrize("setup,cause", [
    (dict(state="killed", signals={"sigterm": {"wall_ns": T0 + 10 * S, "text": ""}}), "sigterm"),
    (dict(state="killed", signals={"fatal": {"wall_ns": T0 + 10 * S,
                                             "text": "Fatal Python error: Segmentation fault\n"}}), "fatal-signal"),
    (dict(state="exited", exit_code=1, events=[{"event": "exception", "type": "ValueError",
                                                "message": "bad batch", "wall_ns": T0 + 10 * S}]), "exception"),
    (dict(state="exited", exit_code=3), "exit-code 3"),
    (dict(state="killed", exit_code=-15), "sigterm"),
])
def test_dead_rank_causes(setup, cause):
    b = ranks(3)
    for r in (0, 2):
        b[r].t += 20 * S   # the others reach the next collective after rank 1 died
        b[r].wait()
    b[1].set(**setup)
    d = check(diagnose(snap(b)), "dead-rank", [1])
    assert d.cause == cause
    if cause == "exception":
        assert d.details["cause_text"] == "ValueError: bad batch"


def test_first_death_by_time_is_root():
    b = ranks(4)
    b[3].set(state="exited", exit_code=1, events=[{"event": "exception", "type": "OSError",
                                                   "message": "disk full", "wall_ns": T0 + 50 * S}])
    b[1].set(state="exited", exit_code=1, events=[{"event": "exception", "type": "KeyError",
                                                   "message": "'x'", "wall_ns": T0 + 20 * S}])
    d = check(diagnose(snap(b)), "dead-rank", [1])
    assert [c["rank"] for c in d.cascade] == [3]


def test_hang_then_sigterm_all_keeps_hang_verdict():
    b = ranks(3)
    b[0].wait()
    b[1].wait()
    later = b[1].t + 3600 * S
    for x in b:
        x.set(state="killed", signals={"sigterm": {"wall_ns": later + x.rank, "text": ""}})
    b[2].set(stacks=stack(*QUEUE_GET))
    d = check(diagnose(snap(b)), "stuck-outside-collective", [2])
    assert "killed later: sigterm" in d.details["culprit_reasons"]["2"]


# --- transport, progressing, unknown --------------------------------------------------------

def test_transport_error_no_dead_rank():
    b = ranks(3)
    for x in b:
        x.t += (3 - x.rank) * S   # rank 2 fails first
        x.coll(state="failed", error="Connection reset by peer")
    d = check(diagnose(snap(b)), "transport-error", [2])
    assert sorted(c["rank"] for c in d.cascade) == [0, 1]
    assert is_transport_error("Timed out waiting 1800000ms for recv operation to complete")


def test_timeout_failures_still_name_stuck_rank():
    b = ranks(3)
    for r in (0, 1):
        b[r].coll(state="failed", error="Timed out waiting 1800000ms for recv operation to complete")
    b[2].set(stacks=stack(*QUEUE_GET))
    d = check(diagnose(snap(b)), "stuck-outside-collective", [2])
    assert sorted(c["rank"] for c in d.cascade) == [0, 1]


def test_progressing_no_rank_waiting():
    b = ranks(4, steps=10)
    d = check(diagnose(snap(b, reason="request", taken=max(x.t for x in b) + S)), "progressing", [])
    assert d.details["last_progress_age_s"] == pytest.approx(1.0, abs=0.01)


def test_progressing_everybody_inside_collective_recently():
    b = ranks(4)
    for x in b:
        x.wait()
    check(diagnose(snap(b, reason="request", taken=max(x.t for x in b) + 2 * S)), "progressing", [])


def test_stalled_everybody_inside_collective_is_unknown():
    b = ranks(4)
    for x in b:
        x.wait()
    d = check(diagnose(snap(b, reason="stall")), "unknown", [])
    assert d.cause == "stalled-inside-collective"


def test_unknown_empty_snapshot():
    s = snap([], errors=["/tmp/run/ring-h-1.htr: truncated (remedy: copy again)"])
    d = check(diagnose(s), "unknown", [])
    assert d.cause == "no-data" and d.errors == s.errors


# --- p2p ----------------------------------------------------------------------------------

def test_p2p_unmatched_send_names_peer():
    b = ranks(2)
    for _ in range(3):
        b[0].p2p("0", 1, "send")
        b[1].p2p("0", 0, "recv")
    b[0].p2p("0", 1, "send", state="issued")   # pair seq 4: rank 1 never posts the recv
    b[1].mark(step=1)
    d = check(diagnose(snap(b)), "skipped-collective", [1])
    assert d.seq == 4 and d.op == "send"


def test_p2p_both_send_is_mismatch():
    b = ranks(2)
    b[0].p2p("0", 1, "send", state="issued")
    b[1].p2p("0", 0, "send", state="issued")
    check(diagnose(snap(b)), "collective-mismatch", [0, 1])


# --- scale, incomplete, wrapped --------------------------------------------------------------

def test_1024_ranks_tp_dp_one_culprit():
    n, tp = 1024, 8
    groups = [world(n)] + [group("tp%d" % i, range(i * tp, (i + 1) * tp), desc="tp") for i in range(n // tp)] \
        + [group("dp%d" % j, range(j, n, tp), desc="dp") for j in range(tp)]
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
            x.wait(tpg)                          # TP mates wait for the culprit
        else:
            x.coll(tpg)
            x.wait(dpg)                          # everyone else waits in DP
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


def test_culprit_without_file_is_unknown_but_named():
    b = ranks(4)
    for r in (0, 1, 2):
        b[r].wait()
    procs = [x.build() for x in b[:3]]
    d = check(diagnose(snap(procs)), "unknown", [3])
    assert d.cause == "no-record-file"


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
    oldp = old.build()
    oldp.start_wall_ns = T0 - 100 * S
    oldp.state = "exited"
    oldp.exit_code = 0
    b[1].set(stacks=stack(*QUEUE_GET))
    d = check(diagnose(snap([oldp] + [x.build() for x in b])), "stuck-outside-collective", [1])
    assert any("several processes" in e for e in d.evidence)


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
    b[1].set(stacks=stack(*QUEUE_GET), events=[{"event": "thread_exception", "thread": "loader",
                                                "type": "IOError", "message": "no such file", "wall_ns": T0}])
    d = check(diagnose(snap(b)), "stuck-outside-collective", [1])
    assert any("thread loader died" in e for e in d.evidence)


def test_random_snapshots_never_raise():
    import random
    from hangtrace.tracer.report.text import text_report
    rnd = random.Random(7)
    ops = ["all_reduce", "broadcast", "barrier", "send", "recv", "all_gather"]
    for trial in range(400):
        n = rnd.randint(1, 9)
        gs = [world(n), group("a", rnd.sample(range(n), rnd.randint(1, n)))]
        bs = [R(r, n, groups=gs) for r in range(n)]
        for x in bs:
            for _ in range(rnd.randint(0, 8)):
                op = rnd.choice(ops)
                g = rnd.choice(["0", "a", "zz"])
                st = rnd.choice(["completed", "completed", "issued", "failed"])
                err = rnd.choice([None, "Connection closed by peer", "boom"]) if st == "failed" else None
                if op in ("send", "recv"):
                    x.p2p(g, rnd.randrange(n), op, state=st, error=err)
                else:
                    x.coll(g, op=op, state=st, error=err, numel=rnd.choice([1, 2]))
            x.set(state=rnd.choice(["alive", "alive", "killed", "exited", "unknown"]),
                  exit_code=rnd.choice([None, 0, 1, -9, -15]))
            if rnd.random() < 0.3:
                x.set(stacks=stack(*rnd.choice([QUEUE_GET, COLL_STACK])))
        procs = [x.build() for x in bs if rnd.random() < 0.85]
        s = snap(procs, reason=rnd.choice(["stall", "request", "offline"]))
        d = diagnose(s)
        assert d.kind in KINDS
        json.dumps(diagnosis_json(d))
        text_report(d, s)
