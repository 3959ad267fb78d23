"""Rule rendezvous (issue 37): a rank waiting at a Ray actor's method that every rank calls in
turn (Ray Train's report: SynchronizationActor.broadcast_from_rank_zero) waits for the ranks
that have not called it; when those wait in a collective new to their loop, they are the
culprits (blind job rt_rank0_barrier: a rank-0-only dist.barrier in Ray Train)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ruleutil import check  # noqa: E402
from synth import MS, R, snap  # noqa: E402
from test_rule_actor_waits import actor, ray_get  # noqa: E402

from hangtrace.tracer.analyze.diagnose import diagnose  # noqa: E402
from hangtrace.tracer.report.paragraph import verdict_paragraph  # noqa: E402


def job(extra_on_rank0="barrier", routine_barrier=False, rank0_called=True, steps=6):
    """Two ranks: per step DDP's all_reduce (and, with ``routine_barrier``, a barrier), then a
    report through the sync actor. At the last step rank 0 enters ``extra_on_rank0`` (blocks);
    rank 1 reports and waits at the actor."""
    sync = actor("SynchronizationActor", 77)
    ranks = [R(r, 2, pid=100 + r) for r in (0, 1)]
    for s in range(1, steps + 1):
        for b in ranks:
            b.mark(step=s)
            b.coll(op="all_reduce", numel=64)
            if routine_barrier:
                b.coll(op="barrier", numel=0)
            if b.rank == 0 and not rank0_called:
                continue
            ray_get(b, [(sync, "broadcast_from_rank_zero")], state="completed", dt=2 * MS)
    r0, r1 = ranks
    for b in ranks:
        b.mark(step=steps + 1)
        b.coll(op="all_reduce", numel=64)
    r0.wait(op=extra_on_rank0, numel=0, dt=5 * MS)
    ray_get(r1, [(sync, "broadcast_from_rank_zero")], dt=10 * MS)
    return snap([r0, r1, sync])


def test_a_new_collective_against_the_actor_rendezvous_names_its_rank():
    d = check(diagnose(job()), "skipped-collective", [0])
    assert d.cause == "extra-collective"
    assert d.details["rendezvous"]["method"] == "SynchronizationActor.broadcast_from_rank_zero"
    assert d.details["rendezvous"]["rank"] == 1 and d.details["rendezvous"]["behind"] == [0]
    text = verdict_paragraph(d)
    assert "rank 0 alone entered barrier" in text
    assert "Rank 1 went on to SynchronizationActor.broadcast_from_rank_zero" in text


def test_a_routine_collective_skipped_by_the_rank_at_the_actor_is_left_to_the_chain():
    """Both ranks barrier every step; rank 1 skipped it and reports: rank 1 is the one."""
    d = diagnose(job(routine_barrier=True))
    assert "rendezvous" not in d.details
    assert d.culprit_ranks == [1], (d.kind, d.culprit_ranks, d.evidence)


def test_an_actor_method_the_waiters_never_call_is_no_rendezvous():
    d = diagnose(job(rank0_called=False))
    assert "rendezvous" not in d.details
    assert d.culprit_ranks == [1], (d.kind, d.culprit_ranks, d.evidence)
