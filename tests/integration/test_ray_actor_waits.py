"""Issue 9 on a real local Ray: the wait-for graph across actor calls and an actor that can
never be scheduled, run as a user runs them (``hangtrace run --stall-s 8 --stop-on-stall``
around a driver that starts its own Ray with ``ray.init(address="local", ...)`` and passes
tracing to its actors through ``runtime_env`` env_vars). The verdict is the first
snapshot's ``diagnosis.json``; evidence comes from the processes' own records
(``hooks/ray_calls.py``), not from Ray's state API (this cluster has no dashboard).

Every process of a job (Ray's own included) inherits the job's ``HANGTRACE_DIR``; after
each test none may be left (those found are killed and the test fails).
"""
import glob
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from jobs import base_env

pytest.importorskip("ray")

CYCLE_JOB = r'''
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
'''

UNSCHEDULABLE_JOB = r'''
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
'''


def _ours(run_dir):
    """pids of live processes whose environment names ``run_dir`` as HANGTRACE_DIR."""
    want = ("HANGTRACE_DIR=%s" % run_dir).encode()
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open("/proc/%s/environ" % pid, "rb") as f:
                if want in f.read().split(b"\0"):
                    with open("/proc/%s/stat" % pid) as st:
                        if st.read().rsplit(")", 1)[1].split()[0] != "Z":
                            out.append(int(pid))
        except OSError:
            pass
    return out


def run_job(tmp_path, source, timeout_s=240):
    """Run ``source`` under ``hangtrace run``; return (first diagnosis, console text)."""
    job = tmp_path / "job.py"
    job.write_text(source)
    run_dir = str(tmp_path / "run")
    p = subprocess.Popen([sys.executable, "-m", "hangtrace", "run", "--stall-s", "8", "--stop-on-stall",
                          "--dir", run_dir, "--", sys.executable, str(job)],
                         env=base_env(traced=False), cwd=str(tmp_path), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
    deadline = time.time() + 30  # Ray's own processes end a few seconds after the driver
    while _ours(run_dir) and time.time() < deadline:
        time.sleep(0.5)
    left = _ours(run_dir)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    assert not left, "processes of the job left running: %s" % left
    diags = []
    for f in sorted(glob.glob(os.path.join(run_dir, "snapshots", "*", "diagnosis.json"))):
        with open(f) as fh:
            diags.append(json.load(fh))
    assert diags, "no verdict:\n" + out[-5000:]
    return diags[0], out


def test_three_actor_call_cycle_is_an_actor_deadlock(tmp_path):
    """Learner.learn -> ray.get(Buffer.sample) -> ray.wait(Sampler.fill) -> ray.get(
    Learner.weights): one cycle of three; the driver waits on it."""
    d, out = run_job(tmp_path, CYCLE_JOB)
    assert d["kind"] == "actor-deadlock", d["summary"] + "\n" + out[-3000:]
    assert d["culprit_actors"] == ["Buffer 'buf'", "Learner", "Sampler"] and d["culprit_ranks"] == []
    cyc = {c["actor"]: c for c in d["details"]["actor_cycle"]}
    assert (cyc["Learner"]["method"], cyc["Learner"]["waits_on"], cyc["Learner"]["target_method"]) == \
        ("learn", "Buffer 'buf'", "sample")
    assert (cyc["Buffer 'buf'"]["api"], cyc["Buffer 'buf'"]["target_method"]) == ("wait", "fill")
    assert cyc["Sampler"]["target_method"] == "weights" and cyc["Sampler"]["target_started"] is False
    assert [w["actor"] for w in d["details"]["actor_waiters"]] == ["driver"]
    assert d["summary"].startswith("Actor deadlock: Ray actors Buffer 'buf', Learner, Sampler"), d["summary"]
    assert "==== hangtrace verdict ====\nActor deadlock:" in out


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
