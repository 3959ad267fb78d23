"""Rule dead_rank and the SIGTERMs that end a job after it failed (analyze/failures/teardown.py).

Blind job ray_dl_worker_segv (2026-12-04): two Ray trainer actors (ranks 0-1, gloo, DDP),
each with DataLoader workers; rank 1's worker segfaults in a ctypes decoder, rank 1's
``train()`` raises "DataLoader worker (pid(s) N) exited unexpectedly" (Ray catches it, the
actor lives on), the driver's ``ray.get`` fails, it calls ``ray.shutdown()`` and 0.33 s later
the raylet SIGTERMs both ranks. The verdict named rank 0, "SIGTERM from the raylet", the root.
Now: rank 1, its exception, its worker's segfault and where; the SIGTERMs are Ray's teardown."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ruleutil import check  # noqa: E402
from synth import MS, S, R, ranks, snap  # noqa: E402

from hangtrace.tracer.analyze.diagnose import diagnose  # noqa: E402
from hangtrace.tracer.analyze.failures.teardown import ray_stopper  # noqa: E402
from hangtrace.tracer.collect.ringprocs import signal_sender  # noqa: E402
from hangtrace.tracer.report.advice import HELPER_CRASH_NEXT  # noqa: E402

RAYLET = (
    "hangtrace: SIGTERM from pid 5400 uid 0: /usr/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet "
    "--raylet_socket_name=/tmp/ray/session_x/sockets/raylet --node_ip_address=10.0.0.2\n"
)
AGENT = "hangtrace: SIGTERM from pid 77 uid 0: /usr/bin/python3 /usr/bin/torchrun --nproc-per-node 2 job.py\n"
IDLE = (
    "Current thread 0x00007facd51bab80 (most recent call first):\n"
    '  File "/usr/lib/python3.11/site-packages/ray/_private/worker.py", line 946 in main_loop\n'
)
EXITED = "RuntimeError: DataLoader worker (pid(s) 4242) exited unexpectedly"
SEGV_DUMP = (
    "Fatal Python error: Segmentation fault\n\nCurrent thread 0x00007f5d1ca3ab80 (most recent call first):\n"
    '  File "/job/job.py", line 46 in __getitem__\n'
    '  File "/usr/lib/python3.11/site-packages/torch/utils/data/_utils/fetch.py", line 54 in fetch\n'
    '  File "/usr/lib/python3.11/site-packages/torch/utils/data/_utils/worker.py", line 374 in _worker_loop\n'
)


def _sigterm(sender, at):
    return {"sigterm": {"wall_ns": at, "text": sender + IDLE, "sender": signal_sender(sender)}}


def _ray_job(sigterm_after_s=0.33, sender=RAYLET, worker=True):
    """Two Trainer actors in method phase 'train'; rank 1's 'train' raises EXITED (its
    DataLoader worker pid 4242 segfaulted 13 ms before); both are SIGTERMed by ``sender``
    ``sigterm_after_s`` after the raise. Rank 0 is in DDP's backward (no record of ours)."""
    b = ranks(2, steps=1)
    for r in b:
        r.set(
            meta={
                "rank_source": 1,
                "ppid": 900,
                "ray_actor_class": "Trainer",
                "ray_actor_id": "%032x" % r.rank,
            }
        )
        r.mark("phase_enter", phase="train")
        r.mark("memory", dt=S)
    b[1].t += 5 * S
    ex = b[1].mark("phase_exit")
    ex["state"], ex["error"] = "failed", EXITED
    t_raise = ex["t_wall_ns"]
    b[1].phase = None
    t_term = t_raise + int(sigterm_after_s * S)
    for r in b:
        r.set(state="killed", signals=_sigterm(sender, t_term))
    procs = list(b)
    if worker:
        w = R(1, 2, groups=[], pid=4242, phase=None)
        w.mark("memory", dt=S)
        w.set(
            state="killed",
            meta={"ppid": b[1].pid, "rank_source": 0},
            signals={"fatal": {"wall_ns": t_raise - 13 * MS, "text": SEGV_DUMP}},
        )
        procs.append(w)
    return procs, t_raise


def test_a_ray_rank_whose_method_raised_before_the_raylet_sigterms_is_the_root():
    """Before: 'rank 0 died first (cause: sigterm-external ... raylet)'; rank 1 was cascade."""
    procs, t_raise = _ray_job()
    d = check(diagnose(snap(procs, reason="death")), "dead-rank", [1])
    assert d.cause == "exception" and d.details["cause_text"] == EXITED, d.summary
    assert d.details["fail_wall_ns"] == t_raise
    assert [(c["rank"], c["victim"]) for c in d.cascade] == [(0, True)], d.cascade
    assert d.details["teardown"]["ranks"] == [0]
    assert (
        "Rank 0 and rank 1 itself then received SIGTERM from Ray's raylet (pid 5400), 0.33 s later: Ray stopping "
        "the job's workers (teardown), not a cause."
    ) in d.summary, d.summary
    assert d.summary.startswith("Dead rank: rank 1 failed first (cause: exception: " + EXITED), d.summary
    assert "find who sent SIGTERM" not in d.summary


def test_the_worker_that_exited_unexpectedly_is_named_by_its_own_fatal_dump():
    """torch said only "exited unexpectedly" (no signal): the worker's fatal-error dump names
    the segfault and the line, and the advice is about native code."""
    procs, _t = _ray_job()
    d = check(diagnose(snap(procs, reason="death")), "dead-rank", [1])
    assert (
        "Rank 1: its DataLoader worker (pid 4242) was killed by signal Segmentation fault in __getitem__ "
        "(job.py:46)." in d.summary
    ), d.summary
    assert HELPER_CRASH_NEXT in d.summary, d.summary


def test_a_raylet_sigterm_with_no_earlier_failure_keeps_its_meaning():
    """No rank raised: the raylet's SIGTERM of rank 1 (memory monitor, ray.kill, preemption)
    is still the root, not teardown."""
    b = ranks(2, steps=3)
    b[0].t += 2 * S
    b[0].wait()
    b[1].mark("memory", dt=S)
    b[1].set(state="killed", signals=_sigterm(RAYLET, b[1].t + S))
    d = check(diagnose(snap(b, reason="death")), "dead-rank", [1])
    assert d.cause in ("sigterm", "sigterm-external") and "teardown" not in d.details, d.summary


def test_a_sigterm_long_after_the_raise_is_the_stop_of_a_stalled_job_not_the_raise_made_a_death():
    """The job hung after rank 1 raised and was stopped 60 s later: the exception is not made
    rank 1's death (the stall rules keep what they make of it: blind job ray_trainer_raise)."""
    procs, _t = _ray_job(sigterm_after_s=60.0, worker=False)
    d = diagnose(snap(procs, reason="death"))
    assert not (d.kind == "dead-rank" and d.cause == "exception" and "teardown" in d.details), d.summary


def test_a_launchers_sigterm_after_the_raise_is_no_ray_teardown_but_the_raise_is_the_failure():
    """A torchrun agent's SIGTERM 0.3 s after rank 1 raised: rank 1 failed by its exception;
    rank 0's SIGTERM is cascade, not called Ray's teardown."""
    procs, _t = _ray_job(sender=AGENT, worker=False)
    d = check(diagnose(snap(procs, reason="death")), "dead-rank", [1])
    assert d.cause == "exception" and [c["rank"] for c in d.cascade] == [0], d.summary
    assert "Ray stopping" not in d.summary
    assert (
        d.details["teardown"]["ranks"] == []
        and "received SIGTERM from pid 77" in d.details["teardown"]["text"]
    )


def test_ray_stopper_names_rays_own_processes_only():
    assert ray_stopper({"sender": signal_sender(RAYLET)}) == "Ray's raylet (pid 5400)"
    assert (
        ray_stopper({"sender": {"pid": 9, "cmdline": "/usr/bin/python3 /usr/local/bin/ray stop --force"}})
        == "`ray stop` (pid 9)"
    )
    assert ray_stopper({"sender": signal_sender(AGENT)}) == ""
    assert ray_stopper({}) == "" and ray_stopper(None) == ""


DRIVER = "hangtrace: SIGTERM from pid 900 uid 0: python3 driver.py\n"
OURS = "hangtrace: SIGTERM from pid 901 uid 0: /usr/bin/python3 -m hangtrace run --stop-on-stall -- python3 d.py\n"


def _idle_sigterm_job(sender=DRIVER, went_on=True, rollout=True):
    """Issue 38, measured: trainer actors (ranks 0-1, method 'train') and a rank-less Rollout
    actor. Rank 1 is SIGTERMed by ``sender`` between two 'train' calls (Ray's handler exits
    it with code 0); the driver starts the next step (``went_on``: rank 0 enters 'train' and
    an all_reduce), its ``ray.get`` fails, ``ray.shutdown()`` makes the raylet SIGTERM the
    Rollout (0.4 s later) and rank 0 (0.5 s later)."""
    b = ranks(2, steps=3)
    for r in b:
        r.set(
            meta={
                "rank_source": 1,
                "ppid": 900,
                "ray_actor_class": "Trainer",
                "ray_actor_id": "%032x" % r.rank,
            }
        )
        r.mark("phase_exit")
    b[1].phase = b[0].phase = None
    t1 = b[1].t + 10 * MS
    b[1].set(state="exited", exit_code=0, signals=_sigterm(sender, t1), exit_wall_ns=t1 + 100 * MS)
    if went_on:
        b[0].t = t1 + 300 * MS
        b[0].mark("phase_enter", phase="train")
        b[0].wait()
    b[0].set(state="killed", signals=_sigterm(RAYLET, t1 + 500 * MS))
    procs = list(b)
    if rollout:
        ro = R(-1, -1, groups=[], pid=61, phase=None)
        ro.set(meta={"ray_actor_id": "%032x" % 61, "ray_actor_class": "Rollout", "ray_actor_name": "rollout"})
        ro.t = t1 - S
        ro.mark("phase_enter", phase="generate")
        ro.mark("phase_exit", dt=300 * MS)
        ro.phase = None
        ro.set(state="killed", signals=_sigterm(RAYLET, t1 + 400 * MS))
        procs.append(ro)
    return procs, t1


def test_an_idle_trainer_sigtermed_from_outside_is_the_root_not_rays_teardown_of_the_rollout():
    """Before: 'Failed Ray actor: Rollout (no rank) failed first (cause: sigterm-external ...
    from the raylet)', culprits []: rank 1, idle and exited 0, was not taken for dead."""
    procs, t1 = _idle_sigterm_job()
    d = check(diagnose(snap(procs, reason="death")), "dead-rank", [1])
    procs[1].set(state="alive")  # measured: its exit record written, its pid still there at the snapshot
    assert check(diagnose(snap(procs, reason="death")), "dead-rank", [1]).culprit_actors == d.culprit_actors
    assert d.culprit_actors == [] or all("Rollout" not in a for a in d.culprit_actors), d.culprit_actors
    assert d.cause in ("sigterm", "sigterm-external") and "pid 900" in d.details["cause_text"], d.summary
    assert d.details["fail_wall_ns"] == t1
    assert [(c["rank"], c["victim"]) for c in d.cascade if c.get("rank", -1) >= 0] == [(0, True)], d.cascade
    assert "Rollout" not in d.summary.split(".")[0], d.summary


def test_an_idle_trainer_that_lives_on_after_an_external_sigterm_is_no_death():
    """A graceful-shutdown handler ended its method and the actor idles, alive (blind job
    ray_preempted_actor_returns): not dead - the chain rule names it (its method returned)."""
    procs, _t = _idle_sigterm_job(rollout=False)
    procs[1].set(state="alive", exit_code=None, exit_wall_ns=None)
    d = diagnose(snap(procs, reason="stall"))
    assert not (d.kind == "dead-rank" and d.culprit_ranks == [1]), d.summary


def test_an_idle_trainer_sigtermed_at_a_clean_end_or_by_hangtrace_is_no_death():
    """Nothing went on after the SIGTERM (a clean end's teardown by a scheduler), or the
    sender is `hangtrace run` stopping the job: rank 1's SIGTERM while idle is no death."""
    for sender, went_on in ((DRIVER, False), (OURS, True)):
        procs, _t = _idle_sigterm_job(sender, went_on=went_on, rollout=False)
        d = diagnose(snap(procs, reason="death"))
        assert 1 not in d.culprit_ranks, (sender, d.summary)


def test_a_rankless_actors_raylet_sigterm_after_a_rank_failed_is_never_a_candidate_root():
    """Whatever Ray's worker exit type says: the raylet's SIGTERM of a rank-less actor after
    rank 1's failure is Ray tearing the job down (``teardown.rankless_teardown``)."""
    from hangtrace.tracer.analyze.context import Ctx
    from hangtrace.tracer.analyze.failures.deaths import fill_death
    from hangtrace.tracer.analyze.failures.teardown import rankless_teardown
    from hangtrace.tracer.analyze.rankview import index_process

    procs, _t = _idle_sigterm_job()
    s = snap(procs, reason="death")
    ctx = Ctx(s, s.taken_wall_ns, 300.0)
    ro = index_process(-1, [p for p in s.processes if p.rank == -1][0])
    fill_death(ro)
    assert ro.dead and rankless_teardown(ctx, ro)
    procs, _t = _idle_sigterm_job(went_on=False)  # no rank failed before: it keeps its meaning
    s = snap(procs, reason="death")
    ro = index_process(-1, [p for p in s.processes if p.rank == -1][0])
    fill_death(ro)
    assert not rankless_teardown(Ctx(s, s.taken_wall_ns, 300.0), ro)
