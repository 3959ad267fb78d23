"""The 3-rank torchrun + DDP + DataLoader job of scripts/ddp_loader_train.py, started traced or
not, and a CPU burner to load the machine beside it (issue 38: a live verdict is about a
window, not an instant)."""

import os
import shutil
import signal
import subprocess
import sys
import time

from jobs import REPO, base_env, free_port

SCRIPT = os.path.join(REPO, "tests", "integration", "scripts", "ddp_loader_train.py")
TORCHRUN = shutil.which("torchrun")
NPROC = 3


def start_job(tmp_path, traced, hang_rank=-1, hang_step=30):
    """torchrun with 3 ranks in its own session; returns (Popen, out dir, run dir)."""
    out = tmp_path / "out"
    run = tmp_path / "run"
    out.mkdir()
    run.mkdir()
    env = base_env(run if traced else None, traced=traced, TMPDIR=tmp_path)
    cmd = [
        TORCHRUN,
        "--nproc-per-node",
        str(NPROC),
        "--master-port",
        str(free_port()),
        SCRIPT,
        "--out",
        str(out),
        "--hang-rank",
        str(hang_rank),
        "--hang-step",
        str(hang_step),
    ]
    log = open(tmp_path / "job.log", "w")
    job = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    return job, out, run


def step_of(out):
    try:
        return int((out / "step").read_text() or 0)
    except (OSError, ValueError):
        return 0


def wait_file(job, path, timeout=180, pred=lambda p: p.exists()):
    """Wait until ``pred(path)``; fail when the job exits first."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred(path):
            return
        if job.poll() is not None:
            raise AssertionError("job exited (%s) before %s" % (job.returncode, path))
        time.sleep(0.1)
    raise AssertionError("timeout waiting for %s" % path)


def descendants(pid):
    """pids of every live descendant of ``pid`` (torchrun starts each rank in a process group
    of its own, so killing torchrun's group leaves the ranks and their DataLoader workers)."""
    children = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open("/proc/%s/stat" % d, "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), ()):
            out.append(c)
            todo.append(c)
    return out


def stop(*procs):
    """SIGKILL each process, its process group and every descendant (the jobs and burners
    run in their own sessions; torchrun's ranks in groups of their own)."""
    for p in procs:
        if p is None:
            continue
        tree = descendants(p.pid)
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
        for pid in tree:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            p.wait(timeout=20)
        except Exception:
            pass


def burner():
    """A CPU burner in its own session: one core busy for as long as it runs."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)


def rank_pids(job):
    """pids of torchrun's children (the ranks), sorted."""
    out = subprocess.run(["pgrep", "-P", str(job.pid)], capture_output=True, text=True).stdout.split()
    return sorted(int(p) for p in out)
