"""`hangtrace attach` on a hung job that was NOT started with hangtrace."""
import json
import os
import signal
import subprocess
import sys

from jobs import REPO, base_env, wait_line


def test_attach_names_stuck_rank_of_uninstrumented_job(tmp_path):
    env = base_env(traced=False)
    env["TMPDIR"] = str(tmp_path)
    job = subprocess.Popen([sys.executable, os.path.join(REPO, "examples", "train_faults.py"),
                            "--fault", "stuck-queue", "--timeout-s", "120"],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)
    try:
        # rank 0 prints a line per finished step; the fault hits at step 2
        wait_line(job, "step 1 done", timeout=90)
        pids = [int(p) for p in subprocess.run(["pgrep", "-P", str(job.pid)], capture_output=True,
                                               text=True).stdout.split()]
        assert len(pids) == 2
        import time
        time.sleep(2.0)  # let rank 1 reach the empty queue and rank 0 the all_reduce
        out = subprocess.run([sys.executable, "-m", "hangtrace", "attach", "--json"] +
                             sum([["--pid", str(p)] for p in pids], []),
                             env=base_env(traced=False, TMPDIR=tmp_path), capture_output=True, text=True,
                             timeout=120)
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
