"""Issue 9, build item 5: ``hangtrace dump --ray`` from another shell on a cluster with Ray's
token authentication (Ray 2.60's default for ``ray.init(address="local")``).

The driver starts its own Ray as the blind jobs do and kills one of its actors; the dump
and the watcher's collection run in separate processes whose environment has no
``RAY_AUTH_*`` and no ``RAY_ADDRESS`` (as in another shell): they are given only the GCS
address, as the watcher takes it from the workers' ``--gcs-address``. Before the fix Ray
sent no token for an explicit address and ``ray.init`` failed after ~20 s ("Failed to
connect to Ray cluster"). Every process of the job inherits its ``HANGTRACE_DIR``; none
may be left after the test.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from jobs import base_env, free_port, reap_job, wait_until

pytest.importorskip("ray")

AUTH_VARS = (
    "RAY_AUTH_MODE",
    "RAY_AUTH_TOKEN",
    "RAY_AUTH_TOKEN_PATH",
    "RAY_ADDRESS",
    "RAY_API_SERVER_ADDRESS",
)

JOB = r"""
import os, signal, sys, time
import ray

signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
ray.init(address="local", num_cpus=2, include_dashboard=False,
         runtime_env={"env_vars": {k: v for k, v in os.environ.items() if k.startswith("HANGTRACE")}})

@ray.remote(num_cpus=0)
class Producer:
    def pid(self):
        return os.getpid()

@ray.remote(num_cpus=0)
class Consumer:
    def pid(self):
        return os.getpid()

try:
    victim = Producer.options(name="victim", max_restarts=0).remote()
    other = Consumer.options(name="bystander").remote()
    vpid = ray.get(victim.pid.remote())
    ray.get(other.pid.remote())
    print("GCS " + ray.get_runtime_context().gcs_address, flush=True)
    os.kill(vpid, signal.SIGKILL)
    time.sleep(3)
    print("KILLED", flush=True)
    time.sleep(300)
finally:
    ray.shutdown()
"""


def _clean_env(**extra):
    env = base_env(traced=False)
    for k in AUTH_VARS:
        env.pop(k, None)
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rayauth")
    run_dir = tmp / "run"
    script = tmp / "job.py"
    script.write_text(JOB)
    env = base_env(run_dir)
    for k in AUTH_VARS:
        env.pop(k, None)  # as a user's shell: Ray decides (token auth, Ray 2.60's default)
    log = open(tmp / "driver.log", "w")
    p = subprocess.Popen(
        [sys.executable, str(script)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        cwd=str(tmp),
    )

    def text():
        with open(tmp / "driver.log") as f:
            return f.read()

    try:
        wait_until(lambda: "KILLED" in text() or p.poll() is not None, timeout=120, period=0.2)
        assert "KILLED" in text(), text()[-3000:]
        gcs = [ln.split()[1] for ln in text().splitlines() if ln.startswith("GCS ")][0]
        yield run_dir, gcs, text
    finally:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)  # ray.shutdown() in the driver stops its cluster
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        log.close()
        reap_job(run_dir, 30)


def _state(snapshot):
    with open(os.path.join(snapshot, "ray_state.json")) as f:
        return json.load(f)


def test_dump_ray_from_another_shell_on_token_auth_cluster(job):
    run_dir, gcs, text = job
    assert "Token authentication is enabled" in text()
    t0 = time.time()
    r = subprocess.run(
        [sys.executable, "-m", "hangtrace", "dump", str(run_dir), "--ray", "--address", gcs, "--json"],
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    took = time.time() - t0
    assert r.returncode == 0, r.stderr[-4000:]
    d = json.loads(r.stdout)
    st = _state(d["snapshot"])
    actors = {a["name"]: a for a in st["actors"]}
    assert actors["victim"]["state"] == "DEAD" and actors["bystander"]["state"] == "ALIVE", st["actors"]
    assert st["source"] == "gcs"  # no dashboard: the GCS tables answer, and the error line says why
    assert any("no dashboard API server" in e for e in st["errors"]), st["errors"]
    # the verdict joins Ray's record: the dead actor is the culprit, Ray's text beside it
    says = d["details"].get("ray_says") or {}
    assert says and any("victim" in k or "Producer" in k for k in says), (d["summary"], says)
    text_says = next(iter(says.values()))["text"]
    assert text_says and "died" in text_says, says
    assert "victim" in json.dumps(d.get("culprit_actors")), d.get("culprit_actors")
    assert took < 60, took


def test_dump_ray_without_address_uses_the_runs_own_cluster(job):
    """No --address, no RAY_ADDRESS: the run's cluster, from its workers' --gcs-address
    (``auto`` would pick any cluster of this host; other sessions run theirs here)."""
    run_dir, gcs, _ = job
    r = subprocess.run(
        [sys.executable, "-m", "hangtrace", "dump", str(run_dir), "--ray", "--json"],
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    st = _state(json.loads(r.stdout)["snapshot"])
    assert {a["name"]: a["state"] for a in st["actors"]}.get("victim") == "DEAD", st["actors"]


def test_watcher_collection_path_on_token_auth_cluster(job, monkeypatch):
    from hangtrace.tracer.collect.ray.rayjob import ray_collect

    run_dir, gcs, _ = job
    for k in AUTH_VARS:
        monkeypatch.delenv(k, raising=False)
    lines = []
    snap = ray_collect(str(run_dir), "request", log=lines.append, address=gcs, timeout_s=90)
    assert snap is not None, lines
    assert "1 node(s)" in lines[-1], lines
    names = {a["name"]: a["state"] for a in snap.ray_state["actors"]}
    assert names.get("victim") == "DEAD", names
    victims = [p for p in snap.processes if (p.meta or {}).get("ray_actor_name") == "victim"]
    assert victims and victims[0].meta.get("ray_actor_state") == "DEAD", [p.meta for p in snap.processes]


def test_no_token_says_what_to_set(job, tmp_path):
    """Token auth on, no token anywhere this process looks: the error names the address,
    the cluster's auth mode and exactly what to set."""
    run_dir, gcs, _ = job
    env = _clean_env(HOME=str(tmp_path))  # no ~/.ray/auth_token here
    r = subprocess.run(
        [sys.executable, "-m", "hangtrace", "dump", str(run_dir), "--ray", "--address", gcs],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode != 0
    err = r.stderr
    assert "cannot connect to the Ray cluster at %s" % gcs in err, err[-3000:]
    assert "RAY_AUTH_MODE=token" in err  # the cluster's GCS runs with it (read from its environment)
    assert "RAY_AUTH_TOKEN=" in err and "RAY_AUTH_TOKEN_PATH=" in err and "ray get-auth-token" in err, err[
        -3000:
    ]


def test_unreachable_address_says_so_quickly(tmp_path):
    addr = "127.0.0.1:%d" % free_port()
    t0 = time.time()
    r = subprocess.run(
        [sys.executable, "-m", "hangtrace", "dump", str(tmp_path), "--ray", "--address", addr],
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0
    assert "cannot reach the Ray cluster at %s" % addr in r.stderr, r.stderr
    assert "--address" in r.stderr and "RAY_ADDRESS" in r.stderr, r.stderr
    assert time.time() - t0 < 20
