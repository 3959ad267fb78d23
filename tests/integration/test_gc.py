"""`hangtrace gc` and the automatic clean-up of `hangtrace run` (issue 13), with real traced
processes for "alive". Every base directory is a pytest tmp_path given as TMPDIR (the
default location) or --dir: the machine's real temp dir is never touched."""

import glob
import os
import signal
import subprocess
import sys
import time

from jobs import base_env, kill_all, wait_line

OLD = time.time() - 7200  # two hours ago: older than the 300 s age guard
HOLD = "import sys; print('ready', flush=True); sys.stdin.read()"


def ht(tmp, *args, **extra):
    env = base_env(traced=False, TMPDIR=tmp, **extra)
    return subprocess.run(
        [sys.executable, "-m", "hangtrace"] + [str(a) for a in args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def make_run(base, name, mib=0.0, age_s=7200.0):
    """A run directory with ``mib`` MiB of real (non-sparse) blocks, last written ``age_s`` ago."""
    d = os.path.join(str(base), name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "hangtrace.log"), "wb") as f:
        f.write(b"x" * int(mib * (1 << 20)))
    age(d, age_s)
    return d


def age(d, age_s=7200.0):
    t = time.time() - age_s
    for p in glob.glob(os.path.join(d, "*")) + [d]:
        if not p.endswith(".pid"):  # a pid file keeps its real time (written after its process started)
            os.utime(p, (t, t))


def start_traced(run_dir):
    """A real traced Python process whose ring is in ``run_dir``; 'ready' once activated."""
    env = base_env(run_dir, traced=True, HANGTRACE_MEM="0")
    p = subprocess.Popen(
        [sys.executable, "-c", HOLD],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_line(p, "ready")
    assert glob.glob(os.path.join(str(run_dir), "ring-*-%d.htr" % p.pid)), os.listdir(str(run_dir))
    return p


def names(base):
    return sorted(os.listdir(str(base)))


def test_live_run_survives_over_limits_and_goes_once_its_process_is_gone(tmp_path):
    live = make_run(tmp_path, "hangtrace-20260101-000000-11", mib=2.0)
    dead = make_run(tmp_path, "hangtrace-20260101-000000-12", mib=0.5)
    p = start_traced(live)
    try:
        age(live)  # only liveness, not the age guard, may protect it
        out = ht(tmp_path, "gc", "--keep", "0", "--max-mb", "0")
        assert out.returncode == 0, out.stderr
        assert names(tmp_path) == [os.path.basename(live)], out.stdout
        assert "alive: pid %d" % p.pid in out.stdout
    finally:
        kill_all([p])
    age(live)
    out = ht(tmp_path, "gc", "--keep", "0", "--max-mb", "0")
    assert out.returncode == 0, out.stderr
    assert names(tmp_path) == [] and not os.path.exists(dead)


def test_killed_process_does_not_protect_its_run(tmp_path):
    d = make_run(tmp_path, "hangtrace-20260101-000000-21")
    p = start_traced(d)
    try:
        os.kill(p.pid, signal.SIGKILL)  # no clean-exit record: the ring says "running"
        p.wait(timeout=30)
    finally:
        kill_all([p])
    age(d)
    out = ht(tmp_path, "gc", "--keep", "0")
    assert out.returncode == 0, out.stderr
    assert names(tmp_path) == []


def test_named_directories_are_never_candidates_in_the_default_location(tmp_path):
    mine = make_run(tmp_path, "my-experiment", mib=1.0)  # HANGTRACE_DIR=.../my-experiment
    own_id = make_run(tmp_path, "hangtrace-nightly", mib=1.0)  # HANGTRACE_RUN_ID=nightly
    auto = make_run(tmp_path, "hangtrace-20260101-000000-31", mib=1.0)
    out = ht(tmp_path, "gc", "--keep", "0", "--max-mb", "0")
    assert out.returncode == 0, out.stderr
    assert names(tmp_path) == ["hangtrace-nightly", "my-experiment"]
    assert not os.path.exists(auto) and os.path.exists(mine) and os.path.exists(own_id)
    # with --dir given, the user asked for that base: its run directories are candidates
    out = ht(tmp_path, "gc", "--dir", tmp_path, "--keep", "1", "--max-mb", "100")
    assert out.returncode == 0, out.stderr
    assert len(names(tmp_path)) == 1


def test_keep_and_max_mb_delete_oldest_first(tmp_path):
    runs = [
        make_run(tmp_path, "hangtrace-20260101-00000%d-4%d" % (i, i), mib=1.0, age_s=3600 * (i + 1))
        for i in range(5)
    ]  # runs[0] newest
    out = ht(tmp_path, "gc", "--keep", "3", "--max-mb", "1000")
    assert out.returncode == 0, out.stderr
    assert names(tmp_path) == sorted(os.path.basename(r) for r in runs[:3]), out.stdout
    out = ht(tmp_path, "gc", "--keep", "100", "--max-mb", "2.5")  # 3 x ~1 MiB > 2.5 MiB
    assert out.returncode == 0, out.stderr
    assert names(tmp_path) == sorted(os.path.basename(r) for r in runs[:2]), out.stdout


def test_dry_run_lists_without_deleting(tmp_path):
    runs = [
        make_run(tmp_path, "hangtrace-20260101-00000%d-5%d" % (i, i), mib=0.2, age_s=3600 * (i + 1))
        for i in range(3)
    ]
    before = names(tmp_path)
    out = ht(tmp_path, "gc", "--keep", "1", "--dry-run")
    assert out.returncode == 0, out.stderr
    assert names(tmp_path) == before
    lines = [l for l in out.stdout.splitlines() if l.startswith("delete")]
    assert sorted(l.split()[-5] for l in lines) == sorted(runs[1:]), out.stdout
    assert "would delete 2 of 3" in out.stdout


def test_watcher_pid_file_protects_a_run_while_its_process_runs(tmp_path):
    d = make_run(tmp_path, "hangtrace-20260101-000000-61")
    w = subprocess.Popen(
        [sys.executable, "-c", HOLD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        wait_line(w, "ready")
        with open(os.path.join(d, "watcher-%s.pid" % os.uname().nodename), "w") as f:
            f.write(str(w.pid))
        age(d)
        out = ht(tmp_path, "gc", "--keep", "0")
        assert os.path.exists(d) and "alive: watcher pid %d" % w.pid in out.stdout, out.stdout
    finally:
        kill_all([w])
    age(d)
    out = ht(tmp_path, "gc", "--keep", "0")
    assert not os.path.exists(d), out.stdout


def test_hangtrace_run_prunes_the_default_location_unless_turned_off(tmp_path):
    old = [make_run(tmp_path, "hangtrace-20260101-00000%d-7%d" % (i, i), mib=0.1) for i in range(3)]
    out = ht(tmp_path, "run", "--", sys.executable, "-c", "pass", HANGTRACE_GC="0", HANGTRACE_GC_KEEP="1")
    assert out.returncode == 0, out.stderr
    assert all(os.path.exists(d) for d in old)
    assert "removed" not in out.stderr
    out = ht(tmp_path, "run", "--", sys.executable, "-c", "pass", HANGTRACE_GC_KEEP="1")
    assert out.returncode == 0, out.stderr
    assert not any(os.path.exists(d) for d in old)
    assert len([l for l in out.stderr.splitlines() if "removed 3 old run directories" in l]) == 1, out.stderr
    # the two runs started here are recent: both kept although keep=1
    assert len(names(tmp_path)) == 2
    assert not glob.glob(os.path.join(str(tmp_path), "*", "run-*.pid"))  # removed at the end
