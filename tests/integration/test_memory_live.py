"""Memory ledger and crash attribution end to end (issue 5): examples/mem_faults.py through
``hangtrace run`` (real gloo ranks, real watcher), a real cgroup OOM kill, the sampler in
a forked child, and the watcher's early warning.

The grow fault needs root and a writable memory cgroup hierarchy (v1 or v2); where the
machine forbids creating one the test is skipped with the reason (the example then runs
its self-watchdog stand-in, which is not a kernel OOM kill). Each example run costs
10-20 s here (``import torch`` in two ranks).
"""

import glob
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from jobs import REPO, base_env, no_memory_cgroup, wait_line

EXAMPLE = os.path.join(REPO, "examples", "mem_faults.py")
MIB = 1 << 20
GIB = 1 << 30


def _can_make_cgroup():
    return no_memory_cgroup()


def run_example(tmp_path, fault, timeout=150):
    run_dir = str(tmp_path / "run")
    cmd = [
        sys.executable,
        "-m",
        "hangtrace",
        "run",
        "--stall-s",
        "20",
        "--dir",
        run_dir,
        "--",
        sys.executable,
        EXAMPLE,
        "--fault",
        fault,
    ]
    p = subprocess.Popen(
        cmd,
        env=base_env(traced=False),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        cwd=REPO,
    )
    try:
        out, err = p.communicate(timeout=timeout)
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
        p.wait()
    diags = []
    for path in sorted(glob.glob(os.path.join(run_dir, "snapshots", "*", "diagnosis.json"))):
        with open(path) as f:
            diags.append(json.load(f))
    why = "rc=%s\nstdout:\n%s\nstderr:\n%s" % (p.returncode, out[-3000:], err[-5000:])
    assert diags, "no diagnosis stored\n" + why
    reports = sorted(glob.glob(os.path.join(run_dir, "snapshots", "*", "report.txt")))
    with open(reports[0]) as f:
        report = f.read()
    return p.returncode, out, err, diags, report, why


def test_real_cgroup_oom_kill_is_host_oom_kill(tmp_path):
    reason = _can_make_cgroup()
    if reason:
        pytest.skip(reason)
    rc, out, err, diags, report, why = run_example(tmp_path, "grow")
    assert "STAND-IN" not in out, why
    assert rc == 137, why  # the launcher's status: 128 + SIGKILL
    d = diags[0]  # the verdict taken at the death
    assert (d["kind"], d["culprit_ranks"], d["cause"]) == ("dead-rank", [1], "host-oom-kill"), d["summary"]
    assert d["phase"] == "train" and d["step"] >= 5, d["summary"]
    a = d["details"]["memory"]["attribution"]["1"]
    at = a["at_death"]
    assert at["limit"] == 450 * MIB and at["phase"] == "train" and at["step"] == d["step"]
    assert at["fraction_of_limit"] >= 0.85, at  # memory vs limit at the last sample
    assert "Killed process" in d["details"]["cause_text"] or "oom_kill" in d["details"]["cause_text"]
    t = [x for x in d["details"]["memory"]["trends"] if x["rank"] == 1][0]
    assert t["growing_phase"] == "train" and 20 * MIB <= t["bytes_per_step"] <= 28 * MIB, t
    assert "of limit 450.0 MiB" in d["summary"] and "in phase 'train'" in d["summary"]
    assert "Ledger (memory just after entering" in report
    # rank 0 is a victim where it shows at all (it may not have reached the next collective yet)
    assert all(c["victim"] for c in d["cascade"] if c["rank"] == 0)
    assert not glob.glob("/sys/fs/cgroup/memory/hangtrace-test-*") and not glob.glob(
        "/sys/fs/cgroup/hangtrace-test-*"
    )


def test_kept_across_validation_checkpoint_then_oom_at_wake_up(tmp_path):
    rc, out, err, diags, report, why = run_example(tmp_path, "kept")
    assert rc == 1, why
    d = diags[0]
    assert (d["kind"], d["cause"]) == ("dead-rank", "cuda-oom"), d["summary"]
    assert (d["phase"], d["step"]) == ("wake_up", 5), d["summary"]
    assert "stand-in" in d["details"]["cause_text"]
    f = d["details"]["memory"]["kept_across"][0]
    assert f["metric"] == "gauge:kv_pool" and f["kept_steps"] == [2, 4] and f["released_steps"] == [1, 3]
    assert f["sequence"] == ["validation", "checkpoint"] and f["bytes_kept"] == {"2": GIB, "4": GIB}
    assert "1.0 GiB of gauge:kv_pool kept across validation -> checkpoint on steps 2, 4" in d["summary"]
    assert "validation every 2 steps" in " ".join(d["details"]["memory"]["advice"])
    assert "Ledger (memory just after entering" in report and "gauge:kv_pool" in report


def test_external_sigterm_with_low_memory_is_not_an_oom(tmp_path):
    rc, out, err, diags, report, why = run_example(tmp_path, "sigterm")
    assert rc == 128 + 15, why
    d = diags[0]
    assert (d["kind"], d["culprit_ranks"], d["cause"]) == ("dead-rank", [1], "sigterm-external"), d["summary"]
    assert "not an OOM" in d["summary"] and "not an OOM" in d["details"]["cause_text"]
    at = d["details"]["memory"]["attribution"]["1"]["at_death"]
    if at["limit"]:
        assert at["fraction_of_limit"] < 0.75


def _script(tmp_path, body):
    p = tmp_path / "s.py"
    p.write_text(textwrap.dedent(body))
    return str(p)


def test_sampler_thread_runs_in_forked_child_and_off_switch(tmp_path):
    s = _script(
        tmp_path,
        """
        import os, sys, threading, time
        from hangtrace import tracer
        names = lambda: sorted(t.name for t in threading.enumerate())
        print("parent", names(), flush=True)
        pid = os.fork()
        if pid == 0:
            tracer.step(1)
            print("child", names(), len(os.listdir("/proc/self/task")), flush=True)
            os._exit(0)
        os.waitpid(pid, 0)
        tracer.step(1)
        print("parent after step", names(), flush=True)
    """,
    )
    out = subprocess.run(
        [sys.executable, s], env=base_env(tmp_path / "run"), capture_output=True, text=True, timeout=60
    ).stdout
    # at bootstrap the timer thread waits (hooks/mem/memclock.py); a forked child starts its own
    # at once, a raw thread (memfork.ChildClock) that threading does not list
    assert "parent ['MainThread']" in out and "child ['MainThread'] 2" in out, out
    assert "parent after step ['MainThread', 'hangtrace-memory']" in out, out
    from hangtrace.tracer.collect.ringprocs import load_rings

    procs, _ = load_rings(str(tmp_path / "run"))
    assert len(procs) == 2 and all(p.memory for p in procs)
    off = subprocess.run(
        [sys.executable, s],
        env=base_env(tmp_path / "run2", HANGTRACE_MEM="0"),
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert "parent ['MainThread']" in off


def test_watcher_warns_before_the_limit(tmp_path):
    from hangtrace.tracer.watch.detector import Watcher

    s = _script(
        tmp_path,
        """
        import time
        from hangtrace import tracer
        keep = []
        for n in range(1, 9):
            tracer.step(n)
            with tracer.phase("train"):
                keep.append(bytearray(16 << 20))
        print("grown", flush=True)
        time.sleep(60)
    """,
    )
    run_dir = str(tmp_path / "run")
    p = subprocess.Popen(
        [sys.executable, s],
        env=base_env(run_dir, RANK=0, WORLD_SIZE=1),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_line(p, "grown", timeout=60)
        lines = []
        w = Watcher(run_dir, stall_s=600)
        w.mem_log = lines.append
        w.poll()
        new = w.memory_warnings()
        assert new and new == lines
        assert any(
            "memory warning: rank 0" in ln and "grows 16.0 MiB/step" in ln and "phase 'train'" in ln
            for ln in lines
        ), lines
        assert w.memory_warnings() == []  # once per process and metric
    finally:
        p.kill()
        p.wait()


def test_ray_trainer_actor_grows_until_cgroup_oom_kill(tmp_path):
    """examples/mem_faults.py --fault ray-grow: a Ray trainer actor in a real memory cgroup."""
    pytest.importorskip("ray")
    reason = _can_make_cgroup()
    if reason:
        pytest.skip("ray-grow needs a real memory cgroup: " + reason)
    rc, out, err, diags, report, why = run_example(tmp_path, "ray-grow", timeout=120)
    run_dir = str(tmp_path / "run")
    if "cannot create a memory cgroup" in out:
        pytest.skip("ray-grow could not create its cgroup: " + out[-500:])
    assert rc == 137, why  # the driver saw the actor die
    assert "Trainer 'trainer-0' pid" in out and "died in train step" in out, why
    assert "Ray says:" in out, why  # Ray's message, printed by the driver

    a = subprocess.run(
        [sys.executable, "-m", "hangtrace", "analyze", "--json", run_dir],
        env=base_env(traced=False),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
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
        assert any("Ray says" in e for e in d["evidence"]), d["evidence"]  # (": " or " (its session log): ")
    assert not glob.glob("/sys/fs/cgroup/memory/hangtrace-test-*") and not glob.glob(
        "/sys/fs/cgroup/hangtrace-test-*"
    )


def test_sampler_thread_waits_past_the_start_and_torch_import(tmp_path):
    """Issue 8: at bootstrap the sampler's timer thread waits (a second thread slows every
    malloc of torch's import and of the exit): none while torch is imported, even past the
    interval; the first garbage collection after the import and one interval after the
    start starts it; so does the first phase/step (and joining a group: the next test). The
    clock (a ``gc.callbacks`` entry) is taken out for the length of torch's import. 'torch' here is a stand-in package that allocates, and so collects,
    for longer than the interval while it is imported."""
    pkg = tmp_path / "fake" / "torch"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        textwrap.dedent("""
        import threading, time
        names = lambda: sorted(t.name for t in threading.enumerate())
        t0, keep = time.monotonic(), []
        while time.monotonic() - t0 < 0.6:
            keep.append({})  # net growth of containers: collections run, the clock is asked
        print("in torch's import", names(), flush=True)
        import gc  # the clock is out of gc.callbacks while torch's import runs, back after it
        print("clock in torch's import", [getattr(c, "__name__", "") for c in gc.callbacks], flush=True)
    """)
    )
    s = _script(
        tmp_path,
        """
        import sys, threading, time
        names = lambda: sorted(t.name for t in threading.enumerate())
        t0, keep = time.monotonic(), []
        if sys.argv[1] == "torch":
            import torch
        elif sys.argv[1] == "step":
            from hangtrace import tracer
            tracer.step(1)
            print("at step", names(), flush=True)
        else:
            while time.monotonic() - t0 < 0.3:
                keep.append({})
            print("early", names(), flush=True)
        while time.monotonic() - t0 < 2.0 and len(names()) == 1:
            keep.append({})
        print("later", names(), flush=True)
        time.sleep(0.2)  # (its first tick: at once, the interval has passed)
    """,
    )
    env = base_env(
        tmp_path / "run",
        HANGTRACE_MEM_INTERVAL_S="0.4",
        PYTHONPATH=os.pathsep.join([str(tmp_path / "fake"), os.environ.get("PYTHONPATH", REPO)]),
    )
    both = "['MainThread', 'hangtrace-memory']"
    out = subprocess.run([sys.executable, s, "torch"], env=env, capture_output=True, text=True, timeout=60)
    assert "in torch's import ['MainThread']" in out.stdout and "later " + both in out.stdout, (
        out.stdout,
        out.stderr,
    )
    assert "clock in torch's import []" in out.stdout, out.stdout  # (and back: "later" needs it)
    out = subprocess.run([sys.executable, s, "plain"], env=env, capture_output=True, text=True, timeout=60)
    assert "early ['MainThread']" in out.stdout and "later " + both in out.stdout, (out.stdout, out.stderr)
    out = subprocess.run([sys.executable, s, "step"], env=env, capture_output=True, text=True, timeout=60)
    assert "at step " + both in out.stdout, (out.stdout, out.stderr)
    from hangtrace.tracer.collect.ringprocs import load_rings

    procs, _ = load_rings(str(tmp_path / "run"))
    assert len(procs) == 3 and all(len(p.memory) >= 2 for p in procs), [len(p.memory) for p in procs]


def test_sampler_thread_starts_when_the_process_joins_a_group(tmp_path):
    """Real torch, a world-size-1 gloo group: the interval (30 s) is far off, so only the
    join starts the timer thread (``memclock.kick`` from the torch.distributed hooks)."""
    pytest.importorskip("torch")
    s = _script(
        tmp_path,
        """
        import socket, threading
        import torch.distributed as dist
        names = lambda: sorted(t.name for t in threading.enumerate())
        print("imported", names(), flush=True)
        with socket.socket() as so:
            so.bind(("127.0.0.1", 0))
            port = so.getsockname()[1]
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=0, world_size=1)
        print("joined", "hangtrace-memory" in names(), flush=True)
        dist.destroy_process_group()
    """,
    )
    out = subprocess.run(
        [sys.executable, s],
        env=base_env(tmp_path / "run", HANGTRACE_MEM_INTERVAL_S="30"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "imported ['MainThread']" in out.stdout and "joined True" in out.stdout, (out.stdout, out.stderr)
