"""Rule mismatch: ranks at one seq issued different collectives (collective-mismatch / mismatch)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ruleutil import check  # noqa: E402
from synth import MS, ranks, snap  # noqa: E402

from hangtrace.tracer.analyze.diagnose import diagnose  # noqa: E402


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
    # two all_reduces are a start, not yet a loop: no history decides (analyze/graph/history.py)
    b = ranks(2, steps=2)
    b[0].wait(op="all_reduce")
    b[1].wait(op="broadcast", peer=0)
    d = check(diagnose(snap(b)), "collective-mismatch", [0, 1])
    assert any("no majority" in e and "history cannot decide" in e for e in d.evidence), d.evidence


def test_mismatch_tie_broken_by_the_loop_each_rank_ran():
    # three all_reduces are a loop: rank 1's broadcast is new to it (issue 37)
    b = ranks(2)
    b[0].wait(op="all_reduce")
    b[1].wait(op="broadcast", peer=0)
    d = check(diagnose(snap(b)), "collective-mismatch", [1])
    assert d.details["changed_by_history"]["victims"] == [0], d.details


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


def test_p2p_both_send_is_mismatch():
    b = ranks(2)
    b[0].p2p("0", 1, "send", state="issued")
    b[1].p2p("0", 0, "send", state="issued")
    check(diagnose(snap(b)), "collective-mismatch", [0, 1])


def test_p2p_both_send_object_list_is_mismatch():
    # same list length and dtype on both sides: only the direction tells them apart
    b = ranks(2)
    b[0].p2p("0", 1, "send_object_list", numel=2, dtype="object", state="issued")
    b[1].p2p("0", 0, "send_object_list", numel=2, dtype="object", state="issued")
    check(diagnose(snap(b)), "collective-mismatch", [0, 1])


def test_mismatch_where_is_the_culprits_call_not_its_current_phase():
    """A blind Ray job: rank 2 all_reduced float64 metrics inside phase 'metrics' of step 5;
    by the collection its process-wide current phase read 'train_step' (the Ray actor
    method around it). The verdict's phase/step are those of the mismatching call."""
    b = ranks(4)
    for r in range(4):
        b[r].mark(phase="metrics", step=5)
        b[r].wait(dtype="float64" if r == 2 else "float32", numel=8)
    b[2].set(phase="train_step", step=6)
    d = check(diagnose(snap(b)), "collective-mismatch", [2])
    assert (d.phase, d.step) == ("metrics", 5), (d.phase, d.step)
    assert "at phase 'metrics', step 5" in d.summary and "train_step" not in d.summary, d.summary
