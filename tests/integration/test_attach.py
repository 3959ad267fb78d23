"""`hangtrace attach` on a hung job that was NOT started with hangtrace."""

import json
import os
import signal
import subprocess
import sys

from jobs import REPO, base_env, blocked, free_port, long_only, wait_line, wait_until


@long_only(
    "test_dump_window.test_attach_to_an_untraced_job_hung_in_a_queue_names_the_rank_in_the_headline "
    "attaches to an untraced torchrun job hung in Queue.get"
)
def test_attach_names_stuck_rank_of_uninstrumented_job(tmp_path):
    env = base_env(traced=False)
    env["TMPDIR"] = str(tmp_path)
    job = subprocess.Popen(
        [
            sys.executable,
            os.path.join(REPO, "examples", "train_faults.py"),
            "--fault",
            "stuck-queue",
            "--timeout-s",
            "120",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        # rank 0 prints a line per finished step; the fault hits at step 2
        wait_line(job, "step 1 done", timeout=90)
        pids = [
            int(p)
            for p in subprocess.run(
                ["pgrep", "-P", str(job.pid)], capture_output=True, text=True
            ).stdout.split()
        ]
        assert len(pids) == 2
        # let rank 1 reach the empty queue and rank 0 the all_reduce: both stop wanting CPU
        # (attach takes two samples; ranks still working towards the hang are progressing)
        wait_until(lambda: blocked(pids), timeout=120, period=0.2)
        out = subprocess.run(
            [sys.executable, "-m", "hangtrace", "attach", "--json"]
            + sum([["--pid", str(p)] for p in pids], []),
            env=base_env(traced=False, TMPDIR=tmp_path),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        d = json.loads(out.stdout)
        assert d["kind"] == "stuck-outside-collective"
        assert d["culprit_ranks"] == [1]
        assert d["waiting_ranks"] == [0]
        assert any("Queue.get" in f or "get (queue.py" in f for f in d["frames"])
        assert os.path.exists(os.path.join(d["snapshot"], "report.txt"))
        # scan mode (no --pid) finds the job's ranks by their RANK/WORLD_SIZE environment
        # (other jobs may run on this machine, so check discovery rather than the choice)
        from hangtrace.tracer.collect.discover import find_torch_processes

        found = {d["pid"]: d for d in find_torch_processes()}
        assert sorted((found[p]["rank"], found[p]["world_size"]) for p in pids) == [(0, 2), (1, 2)]
        assert job.pid not in found  # the launcher has no RANK: not a rank
    finally:
        try:
            os.killpg(job.pid, signal.SIGKILL)
        except OSError:
            pass
        job.wait(timeout=10)


def _start_time(pid):
    import psutil

    return psutil.Process(pid).create_time()


def _python_runnable_by(user):
    """A Python interpreter ``user`` may run (a rank of another user is a Python process;
    this interpreter may live under /root), or None."""
    for exe in ("/usr/bin/python3", sys.executable):
        try:
            if (
                subprocess.run(
                    [exe, "-c", "pass"],
                    user=user,
                    cwd="/",
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    timeout=30,
                ).returncode
                == 0
            ):
                return exe
        except (OSError, subprocess.SubprocessError):
            continue
    return None


def test_attach_without_pid_picks_the_newest_job_of_this_user_and_says_why(tmp_path):
    """Two uninstrumented one-rank jobs of this user started a second apart (and, as root,
    a newer one of another user): `hangtrace attach` takes the newer of this user's and
    names it with the reason on stderr; the older one is a note."""
    import re
    import time
    import psutil

    def job(port, **kw):
        env = base_env(
            traced=False, RANK=0, LOCAL_RANK=0, WORLD_SIZE=1, MASTER_ADDR="127.0.0.1", MASTER_PORT=port
        )
        return subprocess.Popen(
            kw.pop("cmd", [sys.executable, "-c", "import time; time.sleep(120)"]),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            **kw,
        )

    procs = []
    try:
        procs.append(job(free_port()))
        time.sleep(1.2)
        procs.append(job(free_port()))
        older, newer = procs
        other_python = _python_runnable_by("nobody") if os.getuid() == 0 else None
        if other_python:  # a newer job owned by another user is not this user's job
            time.sleep(1.2)
            procs.append(
                job(
                    free_port(),
                    cmd=[other_python, "-c", "import time; time.sleep(120)"],
                    user="nobody",
                    cwd="/",
                )
            )
            assert psutil.Process(procs[2].pid).uids().real != 0
        time.sleep(0.5)
        out = subprocess.run(
            [sys.executable, "-m", "hangtrace", "attach"],
            env=base_env(traced=False, TMPDIR=tmp_path),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        m = re.search(r"hangtrace: attaching to pid (\d+) .*\(started [^)]*\): (.*)$", out.stderr, re.M)
        assert m, out.stderr
        chosen, why = int(m.group(1)), m.group(2)
        assert "torch.distributed job" in why and "owned by uid %d" % os.getuid() in why, why
        assert chosen not in [p.pid for p in procs[2:]]
        if chosen != newer.pid:  # another test's job of this user started after ours meanwhile
            assert chosen != older.pid and _start_time(chosen) >= _start_time(newer.pid), out.stderr
        else:
            assert "pass --pid to choose another" in why
            assert "another job left out (pid %d (rank 0)" % older.pid in out.stdout, out.stdout
            if len(procs) == 3:
                assert "of other users left out" in why, why
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=10)


def test_attach_list_names_each_job_with_its_pids_and_owner(tmp_path):
    """`hangtrace attach --list`: the jobs on this host, newest first, to choose --pid on a
    shared machine (a blind tester's attach without --pid took another user's newer job)."""
    port = free_port()
    env = base_env(
        traced=False, RANK=0, LOCAL_RANK=0, WORLD_SIZE=1, MASTER_ADDR="127.0.0.1", MASTER_PORT=port
    )
    p = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        import time

        time.sleep(0.5)
        out = subprocess.run(
            [sys.executable, "-m", "hangtrace", "attach", "--list"],
            env=base_env(traced=False),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        line = next((ln for ln in out.stdout.splitlines() if "pid %d (rank 0)" % p.pid in ln), None)
        assert line is not None and line.startswith("uid %d: " % os.getuid()), out.stdout
    finally:
        p.kill()
        p.wait(timeout=10)
