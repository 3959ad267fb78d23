"""A node watcher never outlives its run (issue 9 item 5): it exits when the run directory
is deleted or replaced, when its ring files are gone, and when no traced process is alive.
Real watcher processes (auto-started by a traced job, or standalone); nothing is left
running after a test."""

import os
import shutil
import signal
import subprocess
import sys
import time

import psutil
import pytest

from jobs import base_env, wait_line, wait_until

#: a traced process that waits without progress, with a stall threshold it never reaches
SLEEPER = "from hangtrace import tracer; import time; print('ready', flush=True); time.sleep(120)"


def exited(pid):
    """True when ``pid`` is gone or a zombie (an orphaned watcher may wait for a reaper)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def kill(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


@pytest.fixture
def job(tmp_path):
    """A traced sleeper whose first process auto-starts the node watcher; yields (job, run
    dir, watcher pid). Kills both at the end."""
    run = tmp_path / "run"
    env = base_env(run, HANGTRACE_AUTO_WATCH=1, HANGTRACE_POLL_S=0.2, HANGTRACE_STALL_S=600)
    p = subprocess.Popen(
        [sys.executable, "-c", SLEEPER],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    wpid = None
    try:
        wait_line(p, "ready", timeout=60)
        pidfile = run / ("watcher-%s.pid" % os.uname().nodename)
        wpid = wait_until(lambda: pidfile.exists() and int(pidfile.read_text() or 0), timeout=30)
        assert "hangtrace.tracer.watch.watcher" in " ".join(psutil.Process(wpid).cmdline())
        wait_until(lambda: list(run.glob("watcher-*.log")), timeout=30)  # it runs its loop
        yield p, run, wpid
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
        p.wait(timeout=10)
        p.stdout.close()
        p.stderr.close()
        if wpid:
            kill(wpid)


def test_auto_started_watcher_exits_when_its_run_dir_is_deleted(job):
    p, run, wpid = job
    shutil.rmtree(run)
    t = time.monotonic()
    wait_until(lambda: exited(wpid), timeout=10, period=0.1)
    assert time.monotonic() - t < 5
    assert p.poll() is None  # the traced program itself is untouched


def test_auto_started_watcher_exits_when_its_run_dir_is_replaced(job):
    p, run, wpid = job
    shutil.rmtree(run)
    run.mkdir()  # a new run directory of the same name is not this watcher's run
    wait_until(lambda: exited(wpid), timeout=10, period=0.1)
    assert list(run.iterdir()) == []  # and it writes nothing into it


def test_auto_started_watcher_exits_when_every_process_is_gone(job):
    p, run, wpid = job
    os.killpg(p.pid, signal.SIGKILL)
    p.wait(timeout=10)
    wait_until(lambda: exited(wpid), timeout=10, period=0.1)
    assert (
        "no traced process alive on this node; watcher exits" in next(run.glob("watcher-*.log")).read_text()
    )


def test_watcher_exits_when_the_ring_files_are_deleted(tmp_path):
    """Rings removed (the directory stays): after HANGTRACE_STARTUP_STALL_S without any ring."""
    run = tmp_path / "run"
    env = base_env(run, HANGTRACE_POLL_S=0.2, HANGTRACE_STALL_S=600)
    wenv = base_env(
        traced=False,
        HANGTRACE_POLL_S=0.2,
        HANGTRACE_STALL_S=600,
        HANGTRACE_STARTUP_STALL_S=1,
        HANGTRACE_HELPER=1,
    )
    out = subprocess.run(
        [sys.executable, "-m", "hangtrace.tracer.watch.watcher", str(run)],
        env=wenv,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 4 and "cannot watch %s" % run in out.stderr and "remedy" in out.stderr
    p = subprocess.Popen(
        [sys.executable, "-c", SLEEPER], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    w = None
    try:
        wait_line(p, "ready", timeout=60)
        w = subprocess.Popen([sys.executable, "-m", "hangtrace.tracer.watch.watcher", str(run)], env=wenv)
        wait_until(lambda: list(run.glob("watcher-*.log")), timeout=30)
        time.sleep(1.5)
        assert w.poll() is None  # a live traced process: it watches
        for ring in run.glob("ring-*.htr"):
            ring.unlink()
        assert w.wait(timeout=10) == 0
        assert "no ring file in" in next(run.glob("watcher-*.log")).read_text()
        assert p.poll() is None
    finally:
        for q in (p, w):
            if q is not None:
                if q.poll() is None:
                    q.kill()
                q.wait(timeout=10)
        p.stdout.close()
        p.stderr.close()
