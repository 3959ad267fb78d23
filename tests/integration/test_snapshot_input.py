"""Bad input to analyze: missing, corrupt or partial snapshot files -> a clear line for that
file, and the rest analysed. Plus the auto-started node watcher of a run without `hangtrace run`."""

import json
import os
import signal
import subprocess
import sys

from jobs import REPO, base_env, wait_until
from hangtrace.tracer.collect.rings import load_snapshot, take_snapshot


def _make_run(run_dir, n=3):
    for r in range(n):
        subprocess.run(
            [sys.executable, "-c", "from hangtrace import tracer; tracer.step(4)"],
            env=base_env(run_dir, RANK=r, WORLD_SIZE=n),
            check=True,
            timeout=60,
        )


def _analyze(path):
    out = subprocess.run(
        [sys.executable, "-m", "hangtrace", "analyze", "--json", str(path)],
        env=base_env(traced=False),
        capture_output=True,
        text=True,
        timeout=60,
    )
    return out


def test_corrupt_and_missing_snapshot_files(tmp_path):
    run = tmp_path / "run"
    _make_run(run)
    snap = take_snapshot(str(run), reason="request", with_stacks=False)
    rings = sorted(os.listdir(os.path.join(snap.path, "rings")))
    assert len(rings) == 3
    # one ring cut in half, one deleted, processes.json garbage, a stacks file garbage
    bad = os.path.join(snap.path, "rings", rings[0])
    with open(bad, "r+b") as f:
        f.truncate(3000)
    os.unlink(os.path.join(snap.path, "rings", rings[1]))
    with open(os.path.join(snap.path, "stacks", "x-1.json"), "w") as f:
        f.write("{not json")
    good_pid = int(rings[2].rsplit("-", 1)[1].split(".")[0])
    host = rings[2][len("ring-") :].rsplit("-", 1)[0]
    with open(os.path.join(snap.path, "stacks", "%s-%d.json" % (host, good_pid)), "w") as f:
        f.write("{broken")
    with open(os.path.join(snap.path, "processes.json"), "r+") as f:
        meta = json.load(f)
    with open(os.path.join(snap.path, "processes.json"), "w") as f:
        f.write(json.dumps(meta)[:40])
    s = load_snapshot(snap.path)
    assert [p.pid for p in s.processes] == [good_pid]
    errs = "\n".join(s.errors)
    assert rings[0] in errs and "remedy" in errs
    assert "processes.json" in errs and "%s-%d.json" % (host, good_pid) in errs
    out = _analyze(snap.path)
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert rings[0] in "\n".join(d["errors"])
    # the whole run dir analyses too, newest snapshot first
    out2 = _analyze(run)
    assert out2.returncode == 0 and json.loads(out2.stdout)["snapshot"] == snap.path


def test_missing_paths_give_clear_errors(tmp_path):
    out = _analyze(tmp_path / "nope")
    assert out.returncode == 4 and "does not exist" in out.stderr and "remedy" in out.stderr
    (tmp_path / "empty").mkdir()
    out = _analyze(tmp_path / "empty")
    assert out.returncode == 4 and "no ring files" in out.stderr


def test_auto_watcher_reports_a_stall_without_hangtrace_run(tmp_path):
    """HANGTRACE=1 alone (as with torchrun or Ray): the first traced process starts a node
    watcher that writes the verdict to RUN_DIR/watcher-<host>.log."""
    run = tmp_path / "run"
    env = base_env(run, HANGTRACE_AUTO_WATCH=1, HANGTRACE_STALL_S=4, HANGTRACE_POLL_S=0.5)
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
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        log = lambda: open(next(run.glob("watcher-*.log"))).read() if list(run.glob("watcher-*.log")) else ""
        wait_until(lambda: "verdict:" in log(), timeout=150, period=0.5)
        text = log()
        assert "stall" in text and "rank 1" in text and "Stuck outside collectives" in text
        wpid = int(next(run.glob("watcher-*.pid")).read_text())
        os.kill(wpid, 0)
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(timeout=10)

    # the watcher notices the job is gone and exits by itself
    def gone():
        try:
            os.kill(wpid, 0)
            return False
        except ProcessLookupError:
            return True

    wait_until(gone, timeout=30, period=0.5)
