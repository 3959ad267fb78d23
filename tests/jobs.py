"""Helpers for tests that start real processes: free ports, traced gloo jobs, cleanup."""

import os
import signal
import socket
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def base_env(run_dir=None, traced=True, **extra):
    env = dict(os.environ)
    for k in list(env):
        if k.startswith("HANGTRACE"):
            del env[k]
    if traced:
        env["HANGTRACE"] = "1"
        env["HANGTRACE_AUTO_WATCH"] = "0"
    if run_dir is not None:
        env["HANGTRACE_DIR"] = str(run_dir)
    env["PYTHONUNBUFFERED"] = "1"
    env.update({k: str(v) for k, v in extra.items()})
    return env


def start_ranks(script, world_size, run_dir, traced=True, args=(), **extra):
    """Start ``world_size`` python processes running ``script`` as gloo ranks."""
    port = free_port()
    procs = []
    for r in range(world_size):
        env = base_env(
            run_dir,
            traced,
            RANK=r,
            LOCAL_RANK=r,
            WORLD_SIZE=world_size,
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
            **extra,
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script)] + list(args),
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    return procs


def wait_line(proc, prefix, timeout=60):
    """Read stdout lines of ``proc`` until one starts with ``prefix``; return it."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            if proc.poll() is not None:
                raise AssertionError(
                    "process exited (%s) before printing %r: %s"
                    % (proc.returncode, prefix, proc.stderr.read())
                )
            continue
        if line.startswith(prefix):
            return line.strip()
    raise AssertionError("timeout waiting for %r" % prefix)


def wait_until(pred, timeout=30, period=0.05):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(period)
    raise AssertionError("condition not met in %.0f s" % timeout)


def kill_all(procs):
    for p in procs:
        if p.poll() is None:
            try:
                p.kill()
            except OSError:
                pass
    for p in procs:
        try:
            p.wait(timeout=10)
        except Exception:
            pass
        for f in (p.stdout, p.stderr):
            try:
                f and f.close()
            except Exception:
                pass


def finished_ranks(script, world_size, run_dir, **extra):
    """Run ``script`` as ``world_size`` traced gloo ranks to a clean exit; return
    {rank: ProcessInfo} with every record decoded (and no unreadable ring)."""
    from hangtrace.tracer.collect.rings import load_run

    procs = start_ranks(script, world_size, run_dir, **extra)
    try:
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
    finally:
        kill_all(procs)
    snap = load_run(str(run_dir), records=True)
    assert snap.errors == []
    return {p.rank: p for p in snap.processes}


# --- jobs run as a user runs them: ``hangtrace run ... -- CMD`` ------------------------------


def no_memory_cgroup(v1_only=False):
    """Why no child memory cgroup can be made here (not root, read-only cgroupfs, no memory
    hierarchy; with ``v1_only``: a v2 hierarchy), or None when one can."""
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
        return (
            "the job writes cgroup v1 files; this is v2"
            if v1_only and not parent.endswith("memory")
            else None
        )
    return "no memory cgroup hierarchy mounted"


def blind_consts(path, names=("LAUNCH", "NPROC", "EXPECT")):
    """The module-level constants ``names`` of a blind job file (``ast.literal_eval``)."""
    import ast

    out = {}
    for node in ast.parse(open(path).read()).body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id in names
        ):
            out[node.targets[0].id] = ast.literal_eval(node.value)
    return out


def blind_selected(jobs, ci_set, wrong):
    """pytest params of the blind ``jobs`` to run: ``ci_set`` by default, every job with
    ``HANGTRACE_BLIND=all``; those in ``wrong`` (name -> reason) are strict xfails."""
    import pytest

    every = os.environ.get("HANGTRACE_BLIND") == "all"
    out = []
    for path in jobs:
        name = os.path.basename(path)[:-3]
        if not every and name not in ci_set:
            continue
        marks = [pytest.mark.xfail(strict=True, reason=wrong[name])] if name in wrong else []
        out.append(pytest.param(path, id=name, marks=marks))
    return out


def job_processes(run_dir):
    """pids of live (not zombie) processes whose environment names ``run_dir`` as
    HANGTRACE_DIR: every process of a job started with it, Ray's own included."""
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


def reap_job(run_dir, wait_s=30, why=""):
    """Wait up to ``wait_s`` for every process of the job started with HANGTRACE_DIR =
    ``run_dir`` to end (Ray's own end a few seconds after the driver), then kill those left
    and fail the test naming them."""
    deadline = time.time() + wait_s
    while job_processes(run_dir) and time.time() < deadline:
        time.sleep(0.5)
    left = job_processes(run_dir)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    assert not left, "processes of the job left running: %s\n%s" % (left, why)


def run_under_hangtrace(
    cmd, run_dir, cwd, stall_s=10, timeout_s=300, merge_stderr=False, reap_s=None, extra_env=None
):
    """Run ``hangtrace run --stall-s S --stop-on-stall --dir RUN_DIR -- CMD`` in its own
    session, as a user would; kill what is left of the session after it ends or after
    ``timeout_s``. With ``reap_s``, wait that long for the job's other processes (Ray's
    own end a few seconds after the driver), then kill those left and fail. ``extra_env``:
    more variables for ``hangtrace run`` and the job (a job's ``STARTUP_STALL_S``).

    Returns ``(diagnoses, why)``: every snapshot's ``diagnosis.json`` in time order and a
    text with the exit code, duration and the console's tail, for assertion messages."""
    import glob
    import json

    full = [
        sys.executable,
        "-m",
        "hangtrace",
        "run",
        "--stall-s",
        str(stall_s),
        "--stop-on-stall",
        "--dir",
        str(run_dir),
        "--",
    ] + list(cmd)
    p = subprocess.Popen(
        full,
        env=dict(base_env(traced=False), **(extra_env or {})),
        cwd=str(cwd),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    t0 = time.monotonic()
    try:
        out, err = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)  # the job's session: anything left of it
        except OSError:
            pass
    why = "rc=%s %.0fs\nstdout:\n%s\nstderr:\n%s" % (
        p.returncode,
        time.monotonic() - t0,
        (out or "")[-2500:],
        (err or "")[-5000:],
    )
    if reap_s is not None:
        reap_job(run_dir, reap_s, why)
    diags = []
    for f in sorted(glob.glob(os.path.join(str(run_dir), "snapshots", "*", "diagnosis.json"))):
        with open(f) as fh:
            diags.append(json.load(fh))
    return diags, why


def run_under_auto(cmd, run_dir, cwd, stall_s=10, timeout_s=300, settle_s=8, extra_env=None):
    """Run ``CMD`` with ``HANGTRACE=1`` (its first traced process starts the node watcher,
    ``HANGTRACE_AUTO_WATCH``), as a user who exports the variable would, in its own session:
    until the watcher's log gives a verdict (then ``settle_s`` more seconds: what follows is
    part of the incident) or the job ends (then until the watcher has exited, at most 60 s);
    then kill what is left of the session. The watcher stops nothing, so a hung job is killed
    here after its verdict.

    Returns ``(diagnoses, why)`` as :func:`run_under_hangtrace`: the ``diagnosis.json`` of
    each snapshot the watcher's log names after a verdict line, in its order."""
    import glob
    import json
    import re

    env = dict(base_env(run_dir, traced=True, HANGTRACE_STALL_S=stall_s), **(extra_env or {}))
    env["HANGTRACE_AUTO_WATCH"] = "1"
    os.makedirs(str(run_dir), exist_ok=True)
    out_path = os.path.join(str(run_dir), "..", "auto-job.log")
    with open(out_path, "w") as out:
        p = subprocess.Popen(
            list(cmd), env=env, cwd=str(cwd), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )

    def log_text():
        return "".join(open(f).read() for f in glob.glob(os.path.join(str(run_dir), "watcher-*.log")))

    def watchers_alive():
        for f in glob.glob(os.path.join(str(run_dir), "watcher-*.pid")):
            try:
                os.kill(int(open(f).read().split()[0]), 0)
                return True
            except (OSError, ValueError, IndexError):
                pass
        return False

    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < timeout_s:
            if re.search(r"^\S+ verdict: ", log_text(), re.M):
                time.sleep(settle_s)
                break
            if p.poll() is not None:
                end = time.monotonic() + 60
                while watchers_alive() and time.monotonic() < end:
                    time.sleep(0.5)
                break
            time.sleep(1.0)
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
        p.wait()
        time.sleep(2)  # (Ray's own processes, outside the session: killed too, the watcher last)
        for pid in job_processes(run_dir):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    text = log_text()
    with open(out_path) as f:
        job_out = f.read()
    why = "rc=%s %.0fs (HANGTRACE=1)\njob output:\n%s\nwatcher log:\n%s" % (
        p.returncode,
        time.monotonic() - t0,
        job_out[-4000:],
        text[-4000:],
    )
    diags = []
    for snap in re.findall(r"^\S+ snapshot: (\S+)$", text, re.M):
        try:
            with open(os.path.join(snap, "diagnosis.json")) as fh:
                diags.append(json.load(fh))
        except OSError:
            pass
    return diags, why


#: the entry point the blind framework harnesses use: 'run' (``hangtrace run``, default) or
#: 'auto' (``HANGTRACE=1``): ``HANGTRACE_BLIND_ENTRY=auto``
BLIND_ENTRY = os.environ.get("HANGTRACE_BLIND_ENTRY", "run")


def run_blind_entry(cmd, run_dir, cwd, stall_s=15, timeout_s=300, reap_s=None):
    """:func:`run_under_hangtrace` or, with ``HANGTRACE_BLIND_ENTRY=auto``, :func:`run_under_auto`."""
    if BLIND_ENTRY == "auto":
        return run_under_auto(cmd, run_dir, cwd, stall_s=stall_s, timeout_s=timeout_s)
    return run_under_hangtrace(cmd, run_dir, cwd, stall_s=stall_s, timeout_s=timeout_s, reap_s=reap_s)


def blocked(pids, interval_s=0.5):
    """Every process of ``pids`` wanted under 5 % of a CPU over ``interval_s``: blocked."""
    import time

    from hangtrace.tracer.watch.busy import cpu_demand_s

    before = [cpu_demand_s(p) or 0.0 for p in pids]
    time.sleep(interval_s)
    return all((cpu_demand_s(p) or 0.0) - b < 0.05 * interval_s for p, b in zip(pids, before))


def long_only(why: str):
    """A pytest mark: the test runs with ``HANGTRACE_LONG=1`` only (CI's 25-minute budget on 2
    cores, 2026-12-07); ``why`` says what covers its fault in the default run."""
    import pytest

    return pytest.mark.skipif(
        os.environ.get("HANGTRACE_LONG") != "1",
        reason="with HANGTRACE_LONG=1 (CI's 25-minute budget): " + why,
    )
