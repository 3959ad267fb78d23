"""Rule actor_waits: the wait-for graph across Ray actor calls (issue 9) - a cycle of
ray.get waits on actor methods is an actor-deadlock naming every member, its method and
the call it is blocked in; a chain without a cycle names the actor it ends at."""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ruleutil import check  # noqa: E402
from synth import MS, S, R, snap  # noqa: E402

from hangtrace.tracer.analyze.actors import actorgraph  # noqa: E402
from hangtrace.tracer.analyze.diagnose import diagnose  # noqa: E402
from hangtrace.tracer.report.paragraph import verdict_paragraph  # noqa: E402


def aid(pid):
    return "%032x" % pid


def actor(cls, pid, name=""):
    """A rank-less Ray actor process builder (its ring meta names the actor)."""
    b = R(-1, -1, groups=[], pid=pid, phase=None)
    b.set(
        meta={
            "ray_actor_id": aid(pid),
            "ray_actor_class": cls,
            "ray_actor_name": name,
            "ray_job_id": "01000000",
            "ray_worker_id": "w%d" % pid,
        }
    )
    return b


def driver(pid=5):
    b = R(-1, -1, groups=[], pid=pid, phase=None)
    b.set(meta={"ray_job_id": "01000000", "ray_worker_id": "d%d" % pid, "ray_pid": pid})
    return b


def enter(b, method_name, dt=MS):
    b.phase = method_name
    return b.mark("phase_enter", dt=dt)


def ray_get(b, targets, state="issued", api="get", error=None, dt=MS):
    """A K_WAIT record of hooks/rayhooks/ray_calls.py: ``targets`` = [(target builder, method)]."""
    text = json.dumps(
        {
            "api": api,
            "n": len(targets),
            "targets": [
                {"actor_id": aid(t.pid), "class": t.kw["meta"]["ray_actor_class"], "method": m}
                for t, m in targets
            ],
        },
        sort_keys=True,
    )
    return b._rec("ray_wait", "", text, len(targets), dtype="", numel=0, state=state, error=error, dt=dt)


def cycle_job():
    """PolicyTrainer.step -> ray.get(RewardServer.score) -> ray.get(PolicyTrainer.policy_version);
    the driver waits on PolicyTrainer.step (the blind job ray_actor_cycle.py)."""
    drv, tr, rw = driver(), actor("PolicyTrainer", 41), actor("RewardServer", 42)
    for b in (tr, rw):
        enter(b, "__init__")
        b.mark("phase_exit")
        b.phase = None
    ray_get(drv, [(tr, "step")], dt=50 * MS)
    enter(tr, "step", dt=60 * MS)
    ray_get(tr, [(rw, "score")])
    enter(rw, "score", dt=70 * MS)
    ray_get(rw, [(tr, "policy_version")])
    return drv, tr, rw


def test_two_actors_waiting_on_each_other_are_an_actor_deadlock():
    drv, tr, rw = cycle_job()
    d = check(diagnose(snap([drv, tr, rw], reason="stall")), "actor-deadlock", [])
    assert d.culprit_actors == ["PolicyTrainer", "RewardServer"] and d.cause is None
    cyc = d.details["actor_cycle"]
    assert [(c["actor"], c["method"], c["waits_on"], c["target_method"]) for c in cyc] == [
        ("PolicyTrainer", "step", "RewardServer", "score"),
        ("RewardServer", "score", "PolicyTrainer", "policy_version"),
    ]
    assert cyc[0]["target_started"] is True and cyc[1]["target_started"] is False
    assert d.details["actor_waiters"][0]["actor"] == "driver"
    p = verdict_paragraph(d)
    assert p.startswith(
        "Actor deadlock: Ray actors PolicyTrainer, RewardServer wait on each other's methods"
    ), p
    assert "PolicyTrainer in step is blocked in ray.get on RewardServer.score" in p
    assert (
        "RewardServer in score is blocked in ray.get on PolicyTrainer.policy_version, which has not started "
        "(PolicyTrainer is inside step)"
    ) in p
    assert "driver is blocked in ray.get on PolicyTrainer.step" in p


def test_three_actor_cycle_and_stopped_waits_count():
    """A -> B -> C -> A, over ray.wait too; C's wait was ended by Ray's SystemExit when the
    job was stopped (still a wait at the stop): one cycle of three, in wait order."""
    a, b, c = actor("Learner", 51), actor("Buffer", 52, name="buf"), actor("Sampler", 53)
    enter(a, "learn")
    ray_get(a, [(b, "sample")])
    b.t = a.t  # one clock: each call starts after the wait that made it
    enter(b, "sample")
    ray_get(b, [(c, "fill")], api="wait")
    c.t = b.t
    enter(c, "fill")
    ray_get(c, [(a, "weights")], state="failed", error="SystemExit")
    d = check(diagnose(snap([a, b, c], reason="stall")), "actor-deadlock", [])
    assert d.culprit_actors == ["Buffer 'buf'", "Learner", "Sampler"]
    assert [x["actor"] for x in d.details["actor_cycle"]] == ["Learner", "Buffer 'buf'", "Sampler"]
    assert d.details["actor_cycle"][1]["api"] == "wait"
    assert [x["target_started"] for x in d.details["actor_cycle"]] == [True, True, False]
    assert "Buffer 'buf' in sample is blocked in ray.wait on Sampler.fill" in verdict_paragraph(d)


def test_actor_waiting_on_its_own_method_is_a_cycle():
    a = actor("Server", 61)
    enter(a, "handle")
    ray_get(a, [(a, "lookup")])
    d = check(diagnose(snap([a], reason="stall")), "actor-deadlock", [])
    assert d.culprit_actors == ["Server"]


def test_chain_without_cycle_names_the_actor_it_ends_at():
    """driver -> Trainer.step -> Reward.score -> Judge.grade, and Judge is inside grade,
    waiting on no actor (a sleep, a lock): Judge is the culprit, the rest wait on it."""
    drv, t, r, j = driver(), actor("Trainer", 71), actor("Reward", 72), actor("Judge", 73, name="judge-0")
    ray_get(drv, [(t, "step")])
    enter(t, "step")
    ray_get(t, [(r, "score")])
    enter(r, "score")
    ray_get(r, [(j, "grade")])
    enter(j, "grade")
    d = check(diagnose(snap([drv, t, r, j], reason="stall")), "stuck-outside-collective", [])
    assert d.culprit_actors == ["Judge 'judge-0'"] and d.cause == "blocked", d.evidence
    assert [c["actor"] for c in d.details["actor_chain"]] == ["Reward", "Trainer", "driver"]  # nearest first
    p = verdict_paragraph(d)
    assert "Ray actor Judge 'judge-0' (no rank) is in grade and waits on no other actor" in p, p
    assert "Reward in score is blocked in ray.get on Judge 'judge-0'.grade" in p


def test_waits_that_completed_or_without_stall_find_nothing():
    """Completed waits make no edge (the plain 'stuck actors' verdict stays); an open
    cycle in a snapshot that is no stall and recent is not judged."""
    drv, tr, rw = cycle_job()
    d = diagnose(snap([drv, tr, rw], reason="request", taken=rw.t + S))
    assert d.kind == "unknown", d.summary  # no stall: not judged
    a, b = actor("A", 81), actor("B", 82)
    enter(a, "run")
    ray_get(a, [(b, "f")], state="completed")
    enter(b, "g")
    d = check(diagnose(snap([a, b], reason="stall")), "stuck-outside-collective", [])
    assert d.culprit_actors == ["A", "B"] and "actor_chain" not in d.details


def test_actor_failure_comes_before_the_cycle():
    """A method that raised is the root even when waits form a cycle."""
    drv, tr, rw = cycle_job()
    other = actor("Logger", 91)
    enter(other, "flush")
    r = other.mark("phase_exit")
    r["state"], r["error"] = "failed", "OSError: disk full"
    d = check(diagnose(snap([drv, tr, rw, other], reason="stall")), "dead-rank", [])
    assert d.culprit_actors == ["Logger"]


def test_graph_cycles_are_linear_and_separate():
    """Two disjoint two-actor cycles and a waiter into one: two cycles, each in wait order."""
    bs = [actor("X%d" % i, 100 + i) for i in range(4)]
    for i, (src, dst) in enumerate(((0, 1), (1, 0), (2, 3), (3, 2))):
        enter(bs[src], "m%d" % i)
        ray_get(bs[src], [(bs[dst], "n%d" % i)])
    g = actorgraph.build(snap(bs).processes)
    assert sorted(map(sorted, actorgraph.cycles(g))) == [["h0:100", "h0:101"], ["h0:102", "h0:103"]]


def await_ref(b, targets, n, state="issued", dt=MS, thread="AsyncIO Thread: default"):
    """An await record of hooks/rayhooks/ray_calls.py (api 'await', await number ``n``) made on
    Ray's event-loop thread of an async actor."""
    r = ray_get(b, targets, state=state, api="await", dt=dt)
    r["numel"], r["thread"] = n, thread
    return r


def async_cycle_job():
    """The blind job ray2_async_cycle.py: Generator (one slot) in generate ray.get's
    RewardModel.score; RewardModel (async) score awaits RefPolicy.ref_logprobs; RefPolicy
    in ref_logprobs ray.wait's Generator.weights_version, which cannot start. RewardModel
    ran an earlier score whose await completed, and its current phase is another call's."""
    drv, gen, rm, ref = (
        driver(),
        actor("Generator", 201, "generator"),
        actor("RewardModel", 202, "reward-model"),
        actor("RefPolicy", 203, "ref-policy"),
    )
    for b in (gen, rm, ref):
        enter(b, "__init__")
        b.mark("phase_exit")
        b.phase = None
    ray_get(drv, [(gen, "generate")], dt=50 * MS)
    enter(gen, "generate", dt=60 * MS)
    ray_get(gen, [(rm, "score")])
    enter(rm, "score", dt=70 * MS)
    await_ref(rm, [(ref, "ref_logprobs")], 1, state="completed")  # an earlier call of the same loop
    await_ref(rm, [(ref, "ref_logprobs")], 2)
    enter(rm, "status")  # another concurrent call is the thread's current phase now
    enter(ref, "ref_logprobs", dt=80 * MS)
    r = ray_get(ref, [(gen, "weights_version")], api="wait")
    r["thread"] = "ThreadPoolExecutor-0_0"  # a threaded actor's pool thread
    return drv, gen, rm, ref


def test_await_in_an_async_actor_closes_the_cycle():
    """The await edge (from Ray's loop thread, not the main thread) closes the cycle; each
    member is reported with the method call that waits (score), not the async actor's
    current phase (status)."""
    drv, gen, rm, ref = async_cycle_job()
    d = check(diagnose(snap([drv, gen, rm, ref], reason="stall")), "actor-deadlock", [])
    assert d.culprit_actors == [
        "Generator 'generator'",
        "RefPolicy 'ref-policy'",
        "RewardModel 'reward-model'",
    ]
    cyc = {c["actor"]: c for c in d.details["actor_cycle"]}
    assert (cyc["RewardModel 'reward-model'"]["method"], cyc["RewardModel 'reward-model'"]["api"]) == (
        "score",
        "await",
    )
    assert cyc["RefPolicy 'ref-policy'"]["target_started"] is False
    p = verdict_paragraph(d)
    assert (
        "RewardModel 'reward-model' in score is blocked in await on RefPolicy 'ref-policy'.ref_logprobs" in p
    ), p
    assert (
        "RefPolicy 'ref-policy' in ref_logprobs is blocked in ray.wait on Generator 'generator'.weights_version"
        in p
    )
    assert "driver is blocked in ray.get on Generator 'generator'.generate" in p


def test_concurrent_awaits_of_one_async_actor_are_separate_waits():
    """Two calls of one async actor await two different actors on the same loop thread:
    both are open waits (edges), each in its own method."""
    a, b, c = actor("Router", 211), actor("ShardA", 212), actor("ShardB", 213)
    enter(a, "route")
    await_ref(a, [(b, "lookup")], 7)
    enter(a, "fanout")
    await_ref(a, [(c, "lookup")], 8)
    ws = actorgraph.build(snap([a, b, c]).processes).waits["h0:211"]
    assert sorted((w.method, w.targets[0].cls, w.api) for w in ws) == [
        ("fanout", "ShardB", "await"),
        ("route", "ShardA", "await"),
    ]


def test_chain_ending_at_an_idle_actor_whose_method_never_started_names_no_one():
    """driver -> Trainer.step -> Judge.grade, and Judge is inside no method and grade never
    started: the wait that holds the chain is not recorded, so Judge is not blamed as
    'waits on no other actor'; the verdict says the chain is incomplete."""
    drv, t, j = driver(), actor("Trainer", 221), actor("Judge", 222, name="judge-0")
    enter(j, "__init__")
    j.mark("phase_exit")
    j.phase = None
    ray_get(drv, [(t, "step")])
    enter(t, "step")
    ray_get(t, [(j, "grade")])
    j.mark("heartbeat", dt=10 * S)  # its records reach back past the wait: grade did not start
    d = diagnose(snap([drv, t, j], reason="stall"))
    assert d.kind == "unknown" and d.culprit_actors == [], d.summary
    assert d.details["actor_chain_incomplete"]["methods"] == ["grade"]
    p = verdict_paragraph(d)
    assert p.startswith(
        "Unknown: a chain of actor calls waits on Ray actor Judge 'judge-0' (grade), which is inside "
        "no method and never started it"
    ), p
    assert (
        "waits on no other actor" not in p
        and "Trainer in step is blocked in ray.get on Judge 'judge-0'.grade" in p
    )


def test_callee_that_started_before_the_caller_reached_its_await_has_started():
    """The blind run: RefPolicy entered ref_logprobs 1 ms before RewardModel's await record
    (the call was made earlier in score); 'started' is judged from when score began."""
    rm, ref = actor("RewardModel", 231), actor("RefPolicy", 232)
    enter(rm, "score", dt=10 * MS)["thread"] = "AsyncIO Thread: default"
    ref.t = rm.t + MS
    enter(ref, "ref_logprobs")
    rm.t = ref.t + MS
    await_ref(rm, [(ref, "ref_logprobs")], 1)
    ray_get(ref, [(rm, "lookup")])
    d = check(diagnose(snap([rm, ref], reason="stall")), "actor-deadlock", [])
    cyc = {c["actor"]: c for c in d.details["actor_cycle"]}
    assert cyc["RewardModel"]["target_started"] is True, cyc


RAY_GET = (
    "Worker.get_objects /site-packages/ray/_private/worker.py:1007",
    "get /site-packages/ray/_private/worker.py:3009",
    "_wrap_waiting.<locals>.waiting /src/hangtrace/hooks/rayhooks/ray_calls.py:175",
)


def _thread(name, frames, code=None):
    from synth import stack

    t = stack(*frames, active=False)[0]
    t["thread_name"] = name
    for f in t["frames"]:
        if code and f["name"].endswith(code[0]):
            f["code"] = code[1]
    return t


def test_an_actor_calling_itself_through_its_handle_names_the_line_in_the_helper_and_the_passed_object_waiter():
    """Blind helper 61: RolloutWorker.generate calls refresh_weights, which ray.gets the actor's
    own load_weights through its handle; a Learner waits in ray.get on the generate result it
    was passed (no wait record of its own: its stack says so)."""
    drv, w, ln = driver(), actor("RolloutWorker", 71), actor("Learner", 72)
    ray_get(drv, [(w, "generate")], dt=50 * MS)
    enter(w, "generate", dt=60 * MS)
    ray_get(w, [(w, "load_weights")])
    enter(ln, "train")
    w.set(
        stacks=[
            _thread(
                "MainThread",
                RAY_GET
                + (
                    "RolloutWorker.refresh_weights /job/driver.py:35",
                    "RolloutWorker.generate /job/driver.py:48",
                    "Worker.main_loop /site-packages/ray/_private/worker.py:1069",
                ),
                ("refresh_weights", "return ray.get(me.load_weights.remote(version))"),
            )
        ],
        stack_source="py-spy",
    )
    ln.set(
        stacks=[
            _thread(
                "MainThread",
                RAY_GET
                + (
                    "Learner.train /job/driver.py:64",
                    "Worker.main_loop /site-packages/ray/_private/worker.py:1069",
                ),
            )
        ],
        stack_source="py-spy",
    )
    d = check(diagnose(snap([drv, w, ln], reason="stall")), "actor-deadlock", [])
    p = d.summary
    assert p.startswith(
        "Actor deadlock: Ray actor RolloutWorker waits on its own method: RolloutWorker in generate is "
        "blocked in ray.get on RolloutWorker.load_weights at RolloutWorker.refresh_weights (driver.py:35): "
        "`return ray.get(me.load_weights.remote(version))`, which cannot start while generate runs"
    ), p
    assert (
        "Learner in train is blocked in ray.get at Learner.train (driver.py:64) on an object passed to it"
        in p
    ), p
    assert "Next: call the method directly on `self`" in p, p


def test_a_blocking_ray_get_on_an_async_actors_event_loop_is_named():
    """Blind helper 64: an async RolloutManager's rollout ray.gets RewardModel.score, which
    calls back into the manager's async get_running_stats."""
    m, rw = actor("RolloutManager", 81), actor("RewardModel", 82)
    enter(m, "rollout")
    ray_get(m, [(rw, "score")])
    rw.t = m.t
    enter(rw, "score")
    ray_get(rw, [(m, "get_running_stats")])
    loop = (
        "RolloutManager.rollout /job/driver.py:77",
        "wrap_method.<locals>.awrapper /src/hangtrace/hooks/rayhooks/ray_hooks.py:214",
        "Handle._run /lib/python3.11/asyncio/events.py:80",
        "BaseEventLoop._run_once /lib/python3.11/asyncio/base_events.py:1922",
    )
    m.set(
        stacks=[
            _thread("MainThread", ("Worker.main_loop /site-packages/ray/_private/worker.py:1069",)),
            _thread("AsyncIO Thread: default", RAY_GET + loop),
        ],
        stack_source="py-spy",
    )
    d = check(diagnose(snap([m, rw], reason="stall")), "actor-deadlock", [])
    first = d.details["actor_cycle"][0]
    assert (first["actor"], first["at"], first["blocks_loop"]) == (
        "RolloutManager",
        "RolloutManager.rollout (driver.py:77)",
        True,
    ), first
    assert "a blocking call inside its asyncio event loop" in d.summary
    assert "(RolloutManager is inside rollout, its event loop blocked)" in d.summary, d.summary
    assert "Next: in the async actor named above, `await` the actor call" in d.summary
