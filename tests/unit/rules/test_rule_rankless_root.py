"""Rule rankless_root: a Ray actor without a rank that failed beside ranked trainers is the
root when no rank progressed after it and it came before the ranks stalled; the ranks
waiting afterwards are its cascade (issue 9; blind job ray_rollout_crash_trainer_waits)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ruleutil import QUEUE_GET, check  # noqa: E402
from synth import COLL_STACK, MS, S, R, snap, stack  # noqa: E402
from test_rule_actors import actor  # noqa: E402

from hangtrace.tracer.analyze.diagnose import diagnose  # noqa: E402
from hangtrace.tracer.report.paragraph import verdict_paragraph  # noqa: E402

SEGV = "Fatal Python error: Segmentation fault"


def trainers(t):
    """Trainer ranks 0 and 1 after 3 steps at ``t``: rank 0 then blocks outside collectives
    (queue.get for the next rollout batch), rank 1 waits for it in a broadcast."""
    r0, r1 = R(0, 2), R(1, 2)
    for b in (r0, r1):
        b.t = t
        b.coll(n=3)
    r0.mark("step", step=4)
    r0.set(stacks=stack(*QUEUE_GET, active=False))
    r1.mark("step", step=4)
    r1.wait(op="broadcast")
    r1.set(stacks=stack(*COLL_STACK, active=False))
    return r0, r1


def rollout_crash(at):
    """A rank-less RolloutWorker inside generate_loop that segfaults at ``at`` (ns)."""
    ro = actor("RolloutWorker", 61, name="rollout-0")
    ro.phase = "generate_loop"
    ro.mark("phase_enter", dt=MS)
    ro.set(state="killed", signals={"fatal": {"wall_ns": at, "text": SEGV}})
    return ro


def test_rollout_segfault_while_trainers_wait_is_the_root_and_the_ranks_its_cascade():
    """The blind job's shape: trainer 0 waits on the rollout queue, trainer 1 for trainer 0
    in a broadcast; the rollout worker segfaults a second later. Not 'rank 0 stuck'."""
    r0, r1 = trainers(1_700_000_100 * S)
    ro = rollout_crash(r1.t + S)
    d = check(diagnose(snap([ro, r0, r1])), "dead-rank", [])
    assert d.culprit_actors == ["RolloutWorker 'rollout-0'"] and d.cause == "fatal-signal", d.evidence
    assert d.waiting_ranks == [0, 1] and d.details["cause_text"] == SEGV
    assert "blocked outside collectives" in d.details["rank_waits"]["0"]
    assert "broadcast" in d.details["rank_waits"]["1"]
    p = verdict_paragraph(d)
    assert p.startswith(
        "Failed Ray actor: RolloutWorker 'rollout-0' (no rank) failed first (cause: fatal-signal"
    ), p
    assert "No rank progressed after it; ranks 0-1 wait (cascade)" in p, p


def test_ranks_that_went_on_after_the_actor_failed_keep_their_verdict():
    """The rollout worker died, then the trainers completed steps (they did not wait for
    it) and rank 0 blocked outside collectives later: rank 0 stuck, the actor in the
    evidence only."""
    ro = rollout_crash(1_700_000_100 * S)
    r0, r1 = trainers(1_700_000_100 * S + 5 * S)
    d = check(diagnose(snap([ro, r0, r1])), "stuck-outside-collective", [0])
    assert d.culprit_actors == [] and d.details["actor_failures"][0]["actor"] == "RolloutWorker 'rollout-0'"


def test_actor_killed_when_the_hung_job_was_stopped_is_cascade():
    """The ranks stalled (rank 0 stuck outside collectives); 40 s later stopping the job
    killed an actor inside a method without a record: a victim of the stop, not the root."""
    r0, r1 = trainers(1_700_000_100 * S)
    q = actor("_QueueActor", 62)
    q.phase = "get"
    q.mark("phase_enter", dt=MS)
    q.t = r1.t + 40 * S
    q.mark("memory", dt=MS)
    q.set(state="killed")
    d = check(diagnose(snap([q, r0, r1])), "stuck-outside-collective", [0])
    assert d.culprit_actors == []


def test_mismatch_among_the_ranks_stands_beside_a_later_actor_death():
    """A definitive mismatch among the ranks; a rank-less actor segfaults a second after
    their last progress: the mismatch is theirs, the actor is listed."""
    r0, r1 = R(0, 2), R(1, 2)
    for b in (r0, r1):
        b.t = 1_700_000_100 * S
        b.coll(n=2)
    r0.wait(op="all_reduce")
    r1.wait(op="broadcast")
    ro = rollout_crash(r1.t + S)
    d = check(diagnose(snap([ro, r0, r1])), "collective-mismatch", [0, 1])
    assert d.culprit_actors == [] and d.details["actor_failures"]


def test_actor_failure_before_a_later_rank_death_is_the_root():
    """The actor's method raised; a second later rank 0 died of an exception (its batch was
    missing) and rank 1 waits for it: the actor is the root, rank 0's death its cascade."""
    r0, r1 = R(0, 2), R(1, 2)
    for b in (r0, r1):
        b.t = 1_700_000_100 * S
        b.coll(n=3)
    r1.wait(op="broadcast")
    prod = actor("Producer", 63)
    prod.t = r1.t
    prod.phase = "run"
    prod.mark("phase_enter", dt=MS)
    rec = prod.mark("phase_exit", dt=S)
    rec["state"], rec["error"] = "failed", "RuntimeError: rollout engine returned malformed batch"
    r0.set(
        state="exited",
        exit_code=1,
        events=[{"event": "exception", "type": "KeyError", "message": "'batch'", "wall_ns": prod.t + S}],
    )
    d = check(diagnose(snap([prod, r0, r1], reason="death")), "dead-rank", [])
    assert d.culprit_actors == ["Producer"] and d.cause == "exception", d.evidence
    assert [c["rank"] for c in d.cascade] == [0]


def test_rank_death_first_stays_the_root():
    """Rank 0 died first (SIGKILL-like, exit -9), the rank-less actor raised afterwards:
    the rank's death is the root as before."""
    r0, r1 = R(0, 2), R(1, 2)
    for b in (r0, r1):
        b.t = 1_700_000_100 * S
        b.coll(n=3)
    r1.wait(op="broadcast")
    r0.set(state="exited", exit_code=3, exit_wall_ns=r1.t + MS)
    prod = actor("Producer", 64)
    prod.t = r1.t + S
    prod.phase = "run"
    prod.mark("phase_enter", dt=MS)
    rec = prod.mark("phase_exit", dt=MS)
    rec["state"], rec["error"] = "failed", "RuntimeError: consumer gone"
    d = check(diagnose(snap([prod, r0, r1], reason="death")), "dead-rank", [0])
    assert d.culprit_actors == [] and d.cause == "exit-code 3"


def test_processes_that_are_not_ray_actors_are_never_rankless_roots():
    """A rank helper (a DataLoader worker with rank 0's hint) and a launcher (the Ray driver)
    that segfault beside waiting ranks are not rank-less roots: the ranks' verdict stands."""
    r0, r1 = trainers(1_700_000_100 * S)
    helper = R(0, 2, groups=[], pid=71, phase=None)
    helper.set(
        state="killed",
        signals={"fatal": {"wall_ns": r1.t + S, "text": SEGV}},
        meta={"rank_source": 0, "ppid": r0.pid},
    )
    driver = R(-1, -1, groups=[], pid=72, phase=None)
    driver.set(
        state="killed",
        signals={"fatal": {"wall_ns": r1.t + S, "text": SEGV}},
        meta={"ray_job_id": "01000000", "ray_pid": 72},
    )
    d = check(diagnose(snap([helper, driver, r0, r1])), "stuck-outside-collective", [0])
    assert d.culprit_actors == []
