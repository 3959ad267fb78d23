"""Rule silent_mismatch: completed records that disagree at one (group, seq), nobody
waiting and nobody dead. Blind job of 2026-12-02: one rank's (4, 4) table resized to
(4, 5) before ``broadcast(src=0)``; gloo wrote the root's 64 bytes into its 80-byte
buffer, the job exited 0, and the verdict was "progressing"."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from synth import MS, R, snap  # noqa: E402

from hangtrace.tracer.analyze.diagnose import diagnose  # noqa: E402


def exited(b):
    return b.set(state="exited", exit_code=0).build()


def test_a_broadcast_gloo_completed_with_one_rank_resized_is_a_mismatch_naming_it():
    rs = [R(r, 3) for r in range(3)]
    for b in rs:
        b.coll(op="broadcast", numel=16, shape="4x4", peer=0, n=4)
    for b in rs:
        b.coll(
            op="broadcast",
            numel=20 if b.rank == 1 else 16,
            shape="4x5" if b.rank == 1 else "4x4",
            peer=0,
            n=4,
        )
    d = diagnose(snap([exited(b) for b in rs]))
    assert (d.kind, d.cause, d.culprit_ranks, d.seq) == ("collective-mismatch", "mismatch", [1], 5), d.summary
    assert d.details["silent"] is True
    assert [(s["numel"], s["ranks"]) for s in d.details["signatures"]] == [(20, [1]), (16, [0, 2])]
    text = d.summary
    assert "rank 1 issued broadcast with a different size" in text and "completed anyway" in text, text


def test_two_ranks_the_new_dtype_is_named_and_without_a_divergence_nothing_changes():
    r0, r1 = R(0, 2), R(1, 2)
    for b in (r0, r1):
        b.coll(numel=4, n=5)
    r0.coll(numel=4, dtype="int32")  # same bytes as float32: gloo completes it
    r1.coll(numel=4)
    d = diagnose(snap([exited(r0), exited(r1)]))
    assert (d.kind, d.culprit_ranks) == ("collective-mismatch", [0]), d.summary
    assert any("for the first time" in e for e in d.evidence), d.evidence
    r0, r1 = R(0, 2), R(1, 2)
    for b in (r0, r1):
        b.coll(numel=4, n=5)
    d = diagnose(snap([r0.build(), r1.build()]))
    assert d.kind != "collective-mismatch", d.summary


def test_a_later_hang_names_the_earlier_silent_divergence_as_evidence():
    # verl #6365 shape: buffers broadcast in different orders; the first pair completed
    r0, r1 = R(0, 2), R(1, 2)
    for b in (r0, r1):
        b.coll(n=4)
    r0.coll(op="broadcast", numel=32, peer=0)
    r1.coll(op="broadcast", numel=2048, peer=0)
    r0.wait(op="broadcast", numel=2048, peer=0, dt=MS)
    r1.wait(op="broadcast", numel=32, peer=0, dt=MS)
    d = diagnose(snap([r0.build(), r1.build()]))
    assert d.kind == "collective-mismatch" and d.seq == 6, d.summary
    assert any(e.startswith("the members already disagreed earlier, at seq 5") for e in d.evidence), (
        d.evidence
    )


def test_a_silent_mismatch_is_placed_at_the_culprits_call():
    rs = [R(r, 3) for r in range(3)]
    for b in rs:
        b.mark(phase="sync", step=2)
        b.coll(op="broadcast", numel=20 if b.rank == 1 else 16, peer=0, n=1)
        b.mark(phase="eval", step=3)
    d = diagnose(snap([exited(b) for b in rs]))
    assert (d.kind, d.culprit_ranks) == ("collective-mismatch", [1]), d.summary
    assert (d.phase, d.step) == ("sync", 2), (d.phase, d.step, d.summary)
