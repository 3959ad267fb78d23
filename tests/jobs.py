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
        env = base_env(run_dir, traced, RANK=r, LOCAL_RANK=r, WORLD_SIZE=world_size,
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=port, **extra)
        procs.append(subprocess.Popen([sys.executable, str(script)] + list(args), env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return procs


def wait_line(proc, prefix, timeout=60):
    """Read stdout lines of ``proc`` until one starts with ``prefix``; return it."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            if proc.poll() is not None:
                raise AssertionError("process exited (%s) before printing %r: %s"
                                     % (proc.returncode, prefix, proc.stderr.read()))
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
