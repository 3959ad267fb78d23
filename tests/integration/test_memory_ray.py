"""The issue's Ray variant of the memory fault: ``examples/mem_faults.py --fault ray-grow``.

A local Ray job whose Trainer actor ``trainer-0`` keeps 24 MiB per ``train()`` call; the
driver moves the actor's worker process into a real child memory cgroup (400 MiB) and the
kernel OOM-kills it. The job runs under ``hangtrace run`` (its watcher takes the
collection-time facts - kernel OOM line, cgroup counter - while the death is fresh; a later
``analyze`` of a run dir where nothing is alive reads no host facts by design), then
``hangtrace analyze --json RUN_DIR`` must say: dead rank, cause ``host-oom-kill``, Ray actor
``Trainer 'trainer-0'``, phase ``train`` and the step. Ray's own text (a generic "worker
died unexpectedly") is reported apart, as Ray's, never as the cause.

Needs root and a writable memory cgroup hierarchy; skipped with the reason otherwise.
One run costs ~10 s here (a local Ray start).
"""
import glob
import json
import os
import signal
import subprocess
import sys

import pytest

from jobs import REPO, base_env

EXAMPLE = os.path.join(REPO, "examples", "mem_faults.py")
MIB = 1 << 20


def _can_make_cgroup():
    for parent in ("/sys/fs/cgroup/memory", "/sys/fs/cgroup"):
        if parent == "/sys/fs/cgroup" and not os.path.isfile("/sys/fs/cgroup/cgroup.controllers"):
            continue
        if not os.path.isdir(parent):
            continue
        path = os.path.join(parent, "hangtrace-probe-%d" % os.getpid())
        try:
            os.mkdir(path)
        except OSError as e:
            return "cannot create a memory cgroup under %s: %s" % (parent, e)
        os.rmdir(path)
        return None
    return "no memory cgroup hierarchy mounted"


def test_ray_trainer_actor_grows_until_cgroup_oom_kill(tmp_path):
    pytest.importorskip("ray")
    reason = _can_make_cgroup()
    if reason:
        pytest.skip("ray-grow needs a real memory cgroup: " + reason)
    run_dir = str(tmp_path / "run")
    cmd = [sys.executable, "-m", "hangtrace", "run", "--stall-s", "20", "--dir", run_dir, "--",
           sys.executable, EXAMPLE, "--fault", "ray-grow"]
    p = subprocess.Popen(cmd, env=base_env(run_dir, traced=False), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True, cwd=REPO)
    try:
        out, err = p.communicate(timeout=120)
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
        p.wait()
    why = "rc=%s\nstdout:\n%s\nstderr:\n%s" % (p.returncode, out[-3000:], err[-5000:])
    if "cannot create a memory cgroup" in out:
        pytest.skip("ray-grow could not create its cgroup: " + out[-500:])
    assert p.returncode == 137, why                          # the driver saw the actor die
    assert "Trainer 'trainer-0' pid" in out and "died in train step" in out, why
    assert "Ray says:" in out, why                            # Ray's message, printed by the driver

    a = subprocess.run([sys.executable, "-m", "hangtrace", "analyze", "--json", run_dir],
                       env=base_env(traced=False), capture_output=True, text=True, timeout=120, cwd=REPO)
    assert a.returncode == 0, a.stderr[-3000:]
    d = json.loads(a.stdout)
    assert (d["kind"], d["cause"]) == ("dead-rank", "host-oom-kill"), d["summary"] + "\n" + why
    assert d["culprit_ranks"] == [0], d["summary"]
    assert d["phase"] == "train" and isinstance(d["step"], int) and d["step"] >= 5, d["summary"]
    det = d["details"]
    acts = det["culprit_actors"]
    assert [(x["class"], x["name"], x["rank"]) for x in acts] == [("Trainer", "trainer-0", 0)], acts
    assert det["ray_actors"]["0"]["name"] == "trainer-0"
    assert "Trainer 'trainer-0'" in d["summary"]
    assert "Killed process %d" % acts[0]["pid"] in det["cause_text"], det["cause_text"]
    at = det["memory"]["attribution"]["0"]["at_death"]
    assert at["limit"] == 400 * MIB and at["phase"] == "train", at
    # Ray's own death text, where the Ray join filled it, is Ray's: reported apart, not the cause
    says = det.get("ray_says") or {}
    for r, x in says.items():
        assert x["text"] and x["text"] not in det["cause_text"] and x["text"] not in d["cause"], x
        assert any("Ray says:" in e for e in d["evidence"]), d["evidence"]
    assert not glob.glob("/sys/fs/cgroup/memory/hangtrace-test-*") and not glob.glob("/sys/fs/cgroup/hangtrace-test-*")
