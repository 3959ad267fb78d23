"""Rule actors: Ray actors without a rank (issue 9) - the earliest failure (a method that
raised, a death) is the root by name (culprit_actors); stuck actors when nothing fails."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ruleutil import check  # noqa: E402
from synth import MS, S, T0, R, snap  # noqa: E402

from hangtrace.tracer.analyze.diagnose import diagnose  # noqa: E402
from hangtrace.tracer.report.paragraph import verdict_paragraph  # noqa: E402


def actor(cls, pid, name="", **kw):
    """A rank-less Ray actor process builder (its ring meta names the actor)."""
    b = R(-1, -1, groups=[], pid=pid, phase=None)
    b.set(meta={"ray_actor_id": "%032x" % pid, "ray_actor_class": cls, "ray_actor_name": name}, **kw)
    return b


def method(b, name, error=None, dt=MS):
    b.phase = name
    b.mark("phase_enter", dt=dt)
    r = b.mark("phase_exit", dt=dt)
    r["state"] = "failed" if error else "completed"
    r["error"] = error
    b.phase = None
    return r


def test_background_method_raised_names_the_actor_and_its_exception_consumer_is_cascade():
    """Producer.run raised; the Consumer keeps polling pop() (progress), then the driver
    gives up and Ray SIGTERMs both: the producer and its RuntimeError, not 'no rank'."""
    prod, cons = actor("Producer", 11), actor("Consumer", 12)
    method(prod, "run", error="RuntimeError: rollout engine returned malformed batch")
    for _ in range(20):  # pop() answers 'empty' long after run() died
        method(prod, "pop", dt=100 * MS)
        method(cons, "consume_poll", dt=100 * MS)
    cons.phase = "consume"
    cons.mark("phase_enter")
    r = cons.mark("phase_exit", dt=S)
    r["state"], r["error"] = "failed", "SystemExit: 1"  # Ray's SIGTERM handler in the worker
    for b in (prod, cons):
        b.set(state="killed", signals={"sigterm": {"wall_ns": cons.t, "text": "SIGTERM"}})
    d = check(diagnose(snap([prod, cons], reason="death")), "dead-rank", [])
    assert d.culprit_actors == ["Producer"] and d.cause == "exception", d.evidence
    assert "RuntimeError: rollout engine returned malformed batch" in d.details["cause_text"]
    assert {c["actor"] for c in d.cascade} == {"Consumer", "Producer"}  # both SIGTERMed by the driver later
    assert "SystemExit" not in d.details["cause_text"]
    p = verdict_paragraph(d)
    assert "Producer" in p and "RuntimeError" in p and "no rank died" not in p, p


def test_retried_method_that_completed_is_no_failure():
    """A method that raised once and completed on the retry: not a root (its newest exit
    completed); with nothing else failing and no stall, the rule does not find."""
    a = actor("Engine", 21, name="engine-0")
    method(a, "generate", error="TimeoutError: slow")
    method(a, "generate")
    d = diagnose(snap([a], reason="request", taken=a.t + S))
    assert d.kind == "unknown" and d.culprit_actors == [], d.summary


def test_killed_actor_is_the_root_with_its_death_cause():
    """An actor killed without a record (SIGKILL) while its peer waits: dead-rank naming
    it, cause killed-without-record."""
    a, b = actor("RewardModel", 31, name="reward"), actor("Rollout", 32)
    method(a, "score")
    a.phase = "score"
    a.mark("phase_enter")
    a.set(state="killed")
    b.phase = "generate"
    b.mark("phase_enter", dt=5 * S)
    d = check(diagnose(snap([a, b], reason="death")), "dead-rank", [])
    assert d.culprit_actors == ["RewardModel 'reward'"] and d.cause == "killed-without-record", d.evidence


def test_stalled_actors_inside_methods_are_named_stuck():
    """Two actors each inside a method, no failure, the watcher saw a stall: both named,
    with their methods (an actor cycle or a wedged engine)."""
    a, b = actor("PolicyTrainer", 41), actor("RewardServer", 42)
    for x, m in ((a, "step"), (b, "score")):
        x.phase = m
        x.mark("phase_enter")
    d = check(diagnose(snap([a, b], reason="stall")), "stuck-outside-collective", [])
    assert d.culprit_actors == ["PolicyTrainer", "RewardServer"]
    assert d.details["actor_methods"] == {"PolicyTrainer": ["step"], "RewardServer": ["score"]}
    assert "PolicyTrainer in step" in verdict_paragraph(d)


def test_no_actor_keeps_no_data():
    """Processes without rank that are no Ray actors: still 'no traced process with a rank'."""
    a = R(-1, -1, groups=[], pid=51, phase=None)
    a.mark("heartbeat")
    d = diagnose(snap([a]))
    assert (d.kind, d.cause) == ("unknown", "no-data")
    assert T0  # synth's clock is the one used above


def test_rankless_actor_failure_beside_a_ranked_hang_is_in_the_evidence():
    """Trainers with ranks hang; a rollout actor without a rank died first: the ranked
    verdict stands, and the evidence names the actor's death as before the hang began."""
    rollout = actor("RolloutWorker", 61, name="rollout-0")
    rollout.phase = "generate_loop"
    rollout.mark("phase_enter")
    rollout.set(
        state="killed",
        signals={"fatal": {"wall_ns": rollout.t + MS, "text": "Fatal Python error: Segmentation fault"}},
    )
    r0, r1 = R(0, 2), R(1, 2)
    for b in (r0, r1):
        b.t = rollout.t + 5 * S
        b.coll(n=2)
    r0.wait(op="all_reduce")
    r1.wait(op="broadcast")
    d = diagnose(snap([rollout, r0, r1]))
    assert d.kind == "collective-mismatch" and d.culprit_ranks == [0, 1], d.summary
    assert d.details["actor_failures"][0]["actor"] == "RolloutWorker 'rollout-0'"
    assert any("rollout-0" in e and "BEFORE the hang began" in e for e in d.evidence), d.evidence


def queue_job():
    """The blind job ray2_queue_producer_raise.py: Rollout (async) starts a fire-and-forget
    _produce task that puts into a ray.util.queue.Queue and raises at batch 7; Trainer polls
    q.get(timeout=2), each poll a call of Ray's _QueueActor.get ending in Empty (a ring
    from before hooks/ray_infra still has those phases). Rollout answers status() calls."""
    ro, tr = actor("Rollout", 41, name="rollout"), actor("Trainer", 42, name="trainer")
    qa = actor("_QueueActor", 43)
    qa.kw["meta"]["ray_actor_module"] = "ray.util.queue"
    method(ro, "start")
    for _ in range(6):
        method(qa, "put", dt=500 * MS)
        method(qa, "get")
    ro.t = qa.t + 500 * MS
    ro.set(
        events=[
            {
                "event": "task_exception",
                "coro": "Rollout._produce",
                "task": "Task-3",
                "type": "RuntimeError",
                "message": "probability tensor contains either `inf`, `nan` or element < 0",
                "wall_ns": ro.t,
            }
        ]
    )
    tr.phase = "train"
    tr.mark("phase_enter", dt=MS)
    qa.t = ro.t
    for _ in range(10):
        method(qa, "get", error="Empty: ", dt=2 * S)
    method(ro, "status", dt=20 * S)
    return ro, tr, qa


def test_unretrieved_task_exception_of_an_actor_is_the_root_not_the_queues_empty():
    ro, tr, qa = queue_job()
    d = check(diagnose(snap([ro, tr, qa], reason="stall")), "dead-rank", [])
    assert d.culprit_actors == ["Rollout 'rollout'"] and d.cause == "exception", d.evidence
    assert "RuntimeError: probability tensor" in d.details["cause_text"]
    assert "_produce" in d.details["cause_text"] and not d.cascade
    p = verdict_paragraph(d)
    assert p.startswith(
        "Failed Ray actor: Rollout 'rollout' (no rank) failed first (cause: exception: asyncio task "
        "'Rollout._produce' raised RuntimeError"
    ), p
    assert "Empty" not in p and "_QueueActor" not in p


def test_empty_or_full_of_a_users_queue_method_is_no_failure():
    """A user's actor method that raised queue.Empty (its caller's timed poll) is control
    flow: with nothing else failing, the verdict is the stalled actors, not a failure."""
    a, b = actor("Buffer", 51), actor("Learner", 52)
    method(a, "sample", error="Empty: ")
    method(a, "push", error="Full: ")
    b.phase = "learn"
    b.mark("phase_enter")
    d = check(diagnose(snap([a, b], reason="stall")), "stuck-outside-collective", [])
    assert "Learner" in d.culprit_actors and "Empty" not in verdict_paragraph(d), d.evidence


def test_a_stuck_actor_says_where_its_method_waits_and_its_threads_lock_order():
    """Blind helper 55: a rollout actor's update_weights and its cache-refresher thread take two
    locks in opposite orders; the verdict named the actor and method only."""
    from synth import stack

    main = (
        "RolloutWorker.update_weights /job/driver.py:94",
        "actor_method_executor /site-packages/ray/x.py:1",
    )
    refresher = (
        "RolloutWorker._refresh_loop /job/driver.py:66",
        "Thread.run threading.py:982",
        "Thread._bootstrap threading.py:1002",
    )
    th = stack(*main, active=False, extra_threads=[("kv-cache-refresher", refresher)])
    for t, code, held in (
        (th[0], "with self.cache_lock:", [[92, "with self.weights_lock:"]]),
        (th[1], "with self.weights_lock:", [[64, "with self.cache_lock:"]]),
    ):
        t.update(active=False, kernel={"syscall": "futex", "args": []})
        t["frames"][0].update(code=code, **{"with": held})
    a = actor("RolloutWorker", 43, "rollout", stacks=th, stack_source="py-spy")
    a.phase = "update_weights"
    a.mark("phase_enter")
    d = check(diagnose(snap([a], reason="stall")), "stuck-outside-collective", [])
    assert d.details["actor_doing"] == (
        "waiting for a lock at RolloutWorker.update_weights (driver.py:94): "
        "`with self.cache_lock:` (inside `with self.weights_lock:` at driver.py:92)"
    )
    assert (
        "thread 'kv-cache-refresher' at RolloutWorker._refresh_loop (driver.py:66): `with self.weights_lock:` "
        "(inside `with self.cache_lock:` at driver.py:64)" in d.details["lock_wait"]
    ), d.details
    p = verdict_paragraph(d)
    assert (
        "RolloutWorker 'rollout' in update_weights (waiting for a lock at" in p and "lock-order deadlock" in p
    ), p
    assert "Next: make the threads named above take their locks in one order" in p, p


def test_a_stuck_actor_in_an_http_call_names_the_actor_at_the_other_end_and_its_handler_threads():
    """Blind helper 60: a Rollout actor POSTs to a RewardServer actor's HTTP handler, which waits
    on an Event nobody sets; the verdict named the Rollout and the server by pid only."""
    from synth import stack

    roll = stack(
        "SocketIO.readinto /usr/lib/python3.11/socket.py:706",
        "Rollout._score /job/driver.py:60",
        "Rollout.generate /job/driver.py:66",
        active=False,
    )
    roll[0]["kernel"] = {
        "syscall": "recvfrom",
        "wchan": "wait_woken",
        "args": ["fd 54 (TCP 127.0.0.1:5 -> 127.0.0.1:9, ESTABLISHED, peer pid 44 (ray::RewardServer ))"],
    }
    a = actor("Rollout", 43, stacks=roll, stack_source="py-spy")
    a.phase = "generate"
    a.mark("phase_enter")
    handler = (
        "Condition.wait threading.py:327",
        "Event.wait threading.py:629",
        "RewardServer._score /job/driver.py:37",
        "Handler.do_POST /job/driver.py:44",
        "Thread._bootstrap threading.py:1002",
    )
    srv = stack(
        "main_loop /site-packages/ray/_private/worker.py:900",
        active=False,
        extra_threads=[("Thread-5 (process_request_thread)", handler)],
    )
    srv[1].update(active=False)
    srv[1]["frames"][2]["code"] = "self.reload_done.wait()"
    b = actor("RewardServer", 44, stacks=srv, stack_source="py-spy")
    d = check(diagnose(snap([a, b], reason="stall")), "stuck-outside-collective", [])
    assert d.culprit_actors == ["Rollout"]
    assert "peer pid 44: RewardServer)" in d.details["actor_doing"], d.details
    assert d.details["peer_wait"].startswith(
        "The other end, RewardServer (pid 44): its thread 'Thread-5 (process_request_thread)' in RewardServer._score "
        "(driver.py:37): `self.reload_done.wait()`"
    ), d.details["peer_wait"]
    assert "Next: the actor waits on a connection to the process named above" in verdict_paragraph(d)


def test_several_actors_stuck_alike_are_each_said_to_wait_so():
    """Blind helper 60: two Rollout actors blocked in the same HTTP call; the paragraph's one
    "(...)" read as if it described the last actor listed only."""
    from synth import stack

    procs = []
    for pid, name in ((44, "rollout-0"), (45, "rollout-1")):
        th = stack(
            "Rollout.generate /job/driver.py:51",
            "actor_method_executor /site-packages/ray/x.py:1",
            active=False,
        )
        th[0]["frames"][0]["code"] = "resp = conn.getresponse()"
        th[0].update(kernel={"syscall": "recvfrom", "args": ["fd %d (TCP a -> b, ESTABLISHED)" % pid]})
        a = actor("Rollout", pid, name, stacks=th, stack_source="py-spy")
        a.phase = "generate"
        a.mark("phase_enter")
        procs.append(a)
    d = check(diagnose(snap(procs, reason="stall")), "stuck-outside-collective", [])
    assert d.details.get("actor_doing_all") is True
    p = verdict_paragraph(d)
    assert (
        "Rollout 'rollout-0' in generate; Rollout 'rollout-1' in generate (each: blocked in the system call"
        in p
    ), p


def test_a_live_actor_whose_task_died_says_where_it_waits_who_waits_on_it_and_the_idle_ranks():
    """Blind helper 84: trainer actors (ranks 0-1) idle between steps; the rollout actor's
    generation task died of KeyError unseen; its get_batch awaits the queue forever, the
    driver waits in ray.get on it. The verdict named the actor and the exception only."""
    from test_rule_actor_waits import driver, ray_get
    from hangtrace.tracer.snapshot import LoopTasks, PendingTask

    ranks_ = []
    for r in (0, 1):
        b = R(r, 2, pid=70 + r, phase=None)
        b.set(
            meta={
                "ray_actor_id": "%032x" % (70 + r),
                "ray_actor_class": "Trainer",
                "ray_actor_name": "trainer-%d" % r,
                "ray_job_id": "01000000",
                "ray_worker_id": "w%d" % r,
            }
        )
        b.coll(n=5)
        ranks_.append(b)
    ro = actor("RolloutWorker", 81, name="rollout")
    ro.t = ranks_[0].t
    method(ro, "start")
    ro.phase = "get_batch"
    ro.mark("phase_enter", dt=MS)
    ro.set(
        events=[
            {
                "event": "task_exception",
                "coro": "RolloutWorker._generate_loop",
                "task": "Task-3",
                "type": "KeyError",
                "message": "'score'",
                "wall_ns": ro.t + MS,
                "traceback": 'Traceback (most recent call last):\n  File "/job/rl.py", line 30, in _generate_loop\n'
                '    r = reward_fn(s)\n  File "/job/rl.py", line 19, in reward_fn\n'
                "    return s[\"score\"]\nKeyError: 'score'\n",
            }
        ],
        asyncio_loops=(
            LoopTasks(
                thread_id=2,
                tasks=(
                    PendingTask(
                        "Task-16",
                        "get_batch",
                        (
                            ("awrapper", "/x/hangtrace/hooks/rayhooks/ray_hooks.py", 214),
                            ("get_batch", "/job/rl.py", 56),
                            ("get", "/lib/python3.11/asyncio/queues.py", 158),
                        ),
                        awaits_future="<Future pending>",
                    ),
                ),
            ),
        ),
    )
    drv = driver()
    drv.t = ro.t
    ray_get(drv, [(ro, "get_batch")])
    for b in ranks_ + [ro, drv]:
        b.t += 20 * S
    d = check(diagnose(snap(ranks_ + [ro, drv], reason="stall")), "dead-rank", [])
    assert d.culprit_actors == ["RolloutWorker 'rollout'"] and d.cause == "exception", d.evidence
    p = verdict_paragraph(d)
    assert (
        "asyncio task 'RolloutWorker._generate_loop' raised KeyError: 'score' at reward_fn (rl.py:19)" in p
    ), p
    assert (
        "It lives on in get_batch: asyncio event loop: task 'Task-16' in get (queues.py:158) <- get_batch (rl.py:56), "
        "awaiting <Future pending>."
    ) in p, p
    assert "The driver is blocked in ray.get on RolloutWorker 'rollout'.get_batch." in p, p
    assert "Ranks 0-1 (Ray actors) are idle between method calls, in no collective." in p, p
    assert "keep a reference to each task you create and await it" in p, p
