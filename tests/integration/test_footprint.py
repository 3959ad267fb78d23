"""Issue 40: a traced process that exits cleanly leaves no empty stack files; one killed
leaves them until `hangtrace gc` tidies its run."""

import os
import signal
import subprocess
import sys
import time

from jobs import REPO, base_env

from hangtrace.tracer.watch import housekeeping


def test_clean_exit_leaves_no_empty_stack_files_and_gc_tidies_a_killed_one(tmp_path):
    run = tmp_path / "run"
    env = base_env(run, PYTHONPATH=REPO)
    subprocess.run([sys.executable, "-c", "import torch.distributed"], env=env, check=True, timeout=120)
    stacks = run / "stacks"
    assert list(run.glob("ring-*.htr")), os.listdir(run)
    assert not [f for f in stacks.iterdir() if f.stat().st_size == 0] if stacks.exists() else True
    p = subprocess.Popen(
        [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert p.stdout.readline().startswith("up")
    time.sleep(0.2)
    empty = [f for f in stacks.iterdir() if f.stat().st_size == 0 and f.name.endswith("-%d.txt" % p.pid)]
    assert empty  # the dump/SIGTERM files are open while it runs
    p.send_signal(signal.SIGKILL)
    p.wait()
    housekeeping.tidy(str(run))
    assert not [f for f in stacks.iterdir() if f.stat().st_size == 0] if stacks.exists() else True


def test_hangtrace_run_ends_without_the_empty_stack_files_of_its_killed_processes(tmp_path):
    """A traced child SIGKILLed inside `hangtrace run` leaves an empty stack file while it runs;
    the run's end removes it (the folder too, when nothing else is in it)."""
    run = tmp_path / "run"
    code = (
        "import os, signal, subprocess, sys, time\n"
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "time.sleep(1.5)\n"
        "assert any(n.endswith('-%d.txt' % c.pid) for n in os.listdir(os.environ['HANGTRACE_DIR'] + '/stacks'))\n"
        "c.kill(); c.wait()\n"
    )
    p = subprocess.run(
        [sys.executable, "-m", "hangtrace", "run", "--dir", str(run), "--", sys.executable, "-c", code],
        env=base_env(traced=False, PYTHONPATH=REPO),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    stacks = run / "stacks"
    assert not [f.name for f in stacks.iterdir() if f.stat().st_size == 0] if stacks.exists() else True
