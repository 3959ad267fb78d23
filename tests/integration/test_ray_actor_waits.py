"""Issue 9 on a real local Ray: the wait-for graph across actor calls and an actor that can
never be scheduled, run as a user runs them (``hangtrace run --stall-s 8 --stop-on-stall``
around a driver that starts its own Ray with ``ray.init(address="local", ...)`` and passes
tracing to its actors through ``runtime_env`` env_vars). The verdict is the first
snapshot's ``diagnosis.json``; evidence comes from the processes' own records
(``hooks/rayhooks/ray_calls.py``), not from Ray's state API (this cluster has no dashboard).

Every process of a job (Ray's own included) inherits the job's ``HANGTRACE_DIR``; after
each test none may be left (those found are killed and the test fails).
"""

import sys

import pytest

from jobs import long_only, run_under_hangtrace

pytest.importorskip("ray")

CYCLE_JOB = r"""
import os, sys, time
import ray

def env():
    return {k: v for k, v in os.environ.items() if k.startswith("HANGTRACE")}

@ray.remote
class Learner:
    def set(self, buf):
        self.buf = buf
    def weights(self):
        return 1
    def learn(self):
        return ray.get(self.buf.sample.remote())

@ray.remote
class Buffer:
    def set(self, sampler):
        self.sampler = sampler
    def sample(self):
        ready, _ = ray.wait([self.sampler.fill.remote()], num_returns=1)
        return ray.get(ready[0])

@ray.remote
class Sampler:
    def set(self, learner):
        self.learner = learner
    def fill(self):
        return ray.get(self.learner.weights.remote())   # Learner is busy in learn(): never runs

ray.init(address="local", num_cpus=3, include_dashboard=False, runtime_env={"env_vars": env()})
l, b, s = Learner.remote(), Buffer.options(name="buf").remote(), Sampler.remote()
ray.get([l.set.remote(b), b.set.remote(s), s.set.remote(l)])
print("ready", flush=True)
try:
    ray.get(l.learn.remote(), timeout=90)
except ray.exceptions.GetTimeoutError:
    print("learn timed out", flush=True)
ray.shutdown()
"""

UNSCHEDULABLE_JOB = r"""
import os, sys, time
import ray

def env():
    return {k: v for k, v in os.environ.items() if k.startswith("HANGTRACE")}

@ray.remote
class Judge:
    def ping(self):
        return "pong"

@ray.remote
class Controller:
    def setup(self):
        # created by an actor, not the driver; a custom resource no node has
        self.judge = Judge.options(name="judge", resources={"accel": 2}).remote()
        return ray.get(self.judge.ping.remote())

ray.init(address="local", num_cpus=2, include_dashboard=False, runtime_env={"env_vars": env()})
c = Controller.options(name="controller").remote()
print("waiting", flush=True)
try:
    ray.get(c.setup.remote(), timeout=90)
except ray.exceptions.GetTimeoutError:
    print("setup timed out", flush=True)
ray.shutdown()
"""


def run_job(tmp_path, source, timeout_s=240):
    """Run ``source`` under ``hangtrace run``; return (first diagnosis, console text)."""
    job = tmp_path / "job.py"
    job.write_text(source)
    diags, out = run_under_hangtrace(
        [sys.executable, str(job)],
        tmp_path / "run",
        tmp_path,
        stall_s=8,
        timeout_s=timeout_s,
        merge_stderr=True,
        reap_s=30,
    )
    assert diags, "no verdict:\n" + out
    return diags[0], out


def test_three_actor_call_cycle_is_an_actor_deadlock(tmp_path):
    """Learner.learn -> ray.get(Buffer.sample) -> ray.wait(Sampler.fill) -> ray.get(
    Learner.weights): one cycle of three; the driver waits on it."""
    d, out = run_job(tmp_path, CYCLE_JOB)
    assert d["kind"] == "actor-deadlock", d["summary"] + "\n" + out[-3000:]
    assert d["culprit_actors"] == ["Buffer 'buf'", "Learner", "Sampler"] and d["culprit_ranks"] == []
    cyc = {c["actor"]: c for c in d["details"]["actor_cycle"]}
    assert (cyc["Learner"]["method"], cyc["Learner"]["waits_on"], cyc["Learner"]["target_method"]) == (
        "learn",
        "Buffer 'buf'",
        "sample",
    )
    assert (cyc["Buffer 'buf'"]["api"], cyc["Buffer 'buf'"]["target_method"]) == ("wait", "fill")
    assert cyc["Sampler"]["target_method"] == "weights" and cyc["Sampler"]["target_started"] is False
    assert [w["actor"] for w in d["details"]["actor_waiters"]] == ["driver"]
    assert d["summary"].startswith("Actor deadlock: Ray actors Buffer 'buf', Learner, Sampler"), d["summary"]
    assert "==== hangtrace verdict ====\nActor deadlock:" in out


@long_only(
    "CI time: tests/unit/rules/test_rule_unschedulable.py and the golden "
    "test_pending_gpu_actor_is_named_with_what_it_asks_for judge recorded snapshots of it"
)
def test_actor_pending_on_a_resource_no_node_has_is_named_with_its_request(tmp_path):
    """An actor created by another actor asks {accel: 2}; the creator waits on its ping:
    unschedulable-actor naming Judge 'judge' and what it asks for, from our records."""
    d, out = run_job(tmp_path, UNSCHEDULABLE_JOB)
    assert d["kind"] == "unschedulable-actor", d["summary"] + "\n" + out[-3000:]
    assert d["culprit_actors"] == ["Judge 'judge'"] and d["culprit_ranks"] == []
    req = d["details"]["actor_request"]
    assert req["resources"]["accel"] == 2.0 and req["short_of"] == ["accel"]
    assert [w["actor"] for w in d["details"]["actor_waiters"]] == ["Controller 'controller'"]
    assert all("accel" not in n["resources"] for n in d["details"]["cluster_nodes"])
    assert "asks for {CPU: 1, accel: 2}" in d["summary"], d["summary"]


ROLLOUT_JOB = r"""
import asyncio, os, random
import ray, torch, torch.distributed as dist

def env():
    return {k: v for k, v in os.environ.items() if k.startswith("HANGTRACE")}

@ray.remote
class Rollout:
    async def generate(self, step):
        if step == 2:
            await asyncio.Event().wait()      # the engine's wake-up is never signalled
        await asyncio.sleep(0.01)
        return torch.ones(4, 2)

@ray.remote
class Trainer:
    def __init__(self, rank, world, port):
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=world)
        self.model = torch.nn.Linear(2, 1)
    def train_step(self, batch):
        loss = self.model(batch).pow(2).mean()
        loss.backward()
        for p in self.model.parameters():
            dist.all_reduce(p.grad)
        return loss.item()

ray.init(address="local", num_cpus=4, include_dashboard=False, runtime_env={"env_vars": env()})
port = 29000 + random.randint(0, 999)
trainers = [Trainer.remote(r, 2, port) for r in range(2)]
rollout = Rollout.remote()
for step in range(6):
    batch = ray.get(rollout.generate.remote(step), timeout=90)
    print("step", step, ray.get([t.train_step.remote(batch) for t in trainers]), flush=True)
ray.shutdown()
"""


def test_a_rollout_actor_stuck_in_an_await_is_named_while_the_ranked_trainers_idle(tmp_path):
    """An RL loop: a rank-less async Rollout actor never returns from generate (it awaits
    an Event nobody sets); the driver waits in ray.get on it, the two trainer actors (ranks
    0-1, gloo) idle between calls. The verdict names the Rollout actor and its await chain
    (the actor's agent writes its pending tasks; the Ray collector gathers them), not
    "Unknown: nothing progressed but no rank is in a collective" (2026-12-04)."""
    d, out = run_job(tmp_path, ROLLOUT_JOB)
    assert d["kind"] == "stuck-outside-collective", d["summary"] + "\n" + out[-3000:]
    assert d["culprit_actors"] == ["Rollout"] and d["culprit_ranks"] == [], d["summary"]
    doing = d["details"].get("actor_doing") or ""
    assert "generate (job.py:12)" in doing and "wait (locks.py" in doing, d["summary"]
    assert "driver is blocked in ray.get on Rollout.generate" in d["summary"], d["summary"]
