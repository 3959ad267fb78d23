"""CLI robustness: exit codes, messages and the verdict of `hangtrace run` (real subprocesses)."""

import os
import shlex
import signal
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from jobs import base_env, free_port  # noqa: E402

from hangtrace.tracer.ring import layout as F  # noqa: E402
from hangtrace.tracer.ring import reader as R


def ht(*args, env=None, cwd=None, timeout=60):
    return subprocess.run(
        [sys.executable, "-m", "hangtrace"] + [str(a) for a in args],
        env=env or base_env(traced=False),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_run(run_dir, code, *opts, **extra):
    env = base_env(traced=False, RANK=0, LOCAL_RANK=0, WORLD_SIZE=1, HANGTRACE_STARTUP_STALL_S=1, **extra)
    return subprocess.Popen(
        [sys.executable, "-m", "hangtrace", "run", "--dir", str(run_dir), "--poll-s", "0.2"]
        + list(opts)
        + ["--", sys.executable, "-c", code],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_stderr(p, needle, timeout=60):
    """Read p's stderr lines until one contains ``needle``; returns the lines read."""
    lines = []
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = p.stderr.readline()
        if not line:
            break
        lines.append(line)
        if needle in line:
            return lines
    raise AssertionError("no %r in stderr: %s" % (needle, "".join(lines)))


HANG = "import os, time; print('ready', os.getpid(), flush=True); time.sleep(120)"


def snapshots(run_dir):
    d = os.path.join(str(run_dir), "snapshots")
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


@pytest.mark.parametrize("how", ["user_sigterm", "launcher_sigkill", "stop_on_stall"])
def test_stopping_after_stall_keeps_the_stall_verdict(tmp_path, how):
    run_dir = tmp_path / "run"
    opts = ["--stall-s", "1"] + (["--stop-on-stall"] if how == "stop_on_stall" else [])
    p = start_run(run_dir, HANG, *opts)
    try:
        job_pid = int(p.stdout.readline().split()[1])
        wait_stderr(p, "==== hangtrace verdict")
        if how == "user_sigterm":
            p.send_signal(signal.SIGTERM)
        elif how == "launcher_sigkill":
            time.sleep(1)
            os.kill(job_pid, signal.SIGKILL)
        rc = p.wait(timeout=60)
        rest = p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert rc in (128 + signal.SIGTERM, 128 + signal.SIGKILL), rest
    assert "==== hangtrace verdict" not in rest, rest
    assert "death detected" not in rest, rest
    assert "hangtrace: hangtrace:" not in rest
    assert len(snapshots(run_dir)) == 1
    out = ht("analyze", run_dir)
    assert out.returncode == 0, out.stderr
    assert "dead rank" not in out.stdout.lower()


def test_second_sigint_kills_job_without_verdict(tmp_path):
    code = (
        "import os, signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
        "print('ready', os.getpid(), flush=True); time.sleep(120)"
    )
    p = start_run(tmp_path / "run", code, "--stall-s", "600")
    try:
        p.stdout.readline()
        p.send_signal(signal.SIGINT)
        time.sleep(0.5)
        assert p.poll() is None  # forwarded, ignored by the job
        p.send_signal(signal.SIGINT)
        rc = p.wait(timeout=30)
        err = p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert rc == 128 + signal.SIGKILL, err
    assert "verdict" not in err and "Unknown" not in err and "no ring files" not in err, err


def test_first_sigint_forwarded_no_postmortem(tmp_path):
    p = start_run(tmp_path / "run", HANG, "--stall-s", "600")
    try:
        p.stdout.readline()
        p.send_signal(signal.SIGINT)
        rc = p.wait(timeout=30)
        err = p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert rc not in (0, 128 + signal.SIGKILL), err
    assert "verdict" not in err and "Unknown" not in err, err
    assert "hangtrace: hangtrace:" not in err


def test_env_is_shell_quoted(tmp_path):
    for d in ["a b", "x;echo PWNED", "it's"]:
        out = ht("env", "--export", "--dir", d, cwd=tmp_path)
        assert out.returncode == 0
        script = out.stdout + 'printf "%s" "$HANGTRACE_DIR"\n'
        res = subprocess.run(["sh", "-c", script], capture_output=True, text=True)
        assert res.stdout == str(tmp_path / d) and "PWNED\n" not in res.stdout
        assert ("export HANGTRACE_DIR=%s" % shlex.quote(str(tmp_path / d))) in out.stdout


def test_run_bad_dir_is_user_error(tmp_path):
    f = tmp_path / "README.md"
    f.write_text("x")
    for d in [f, "/proc/xx"]:
        out = ht("run", "--dir", d, "--", "true")
        assert out.returncode == 2, out.stderr
        assert "Traceback" not in out.stderr and "remedy:" in out.stderr


def test_run_missing_command_127_no_dir_left(tmp_path):
    d = tmp_path / "run"
    out = ht("run", "--dir", d, "--", "no-such-cmd-hangtrace")
    assert out.returncode == 127, out.stderr
    assert "no-such-cmd-hangtrace" in out.stderr and "Traceback" not in out.stderr
    assert "hangtrace: hangtrace:" not in out.stderr
    assert not d.exists()


@pytest.mark.parametrize("value", ["0", "-1", "nan", "abc"])
def test_stall_s_must_be_positive(tmp_path, value):
    out = ht("run", "--stall-s", value, "--dir", tmp_path / "r", "--", "true")
    assert out.returncode == 2 and "--stall-s" in out.stderr
    assert not (tmp_path / "r").exists()


def test_exit_codes_of_analyze_and_records(tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "ring-h-1.htr").write_bytes(b"garbage" * 100)
    (bad / "ring-h-2.htr").write_bytes(b"HTRING01")
    empty = tmp_path / "empty"
    empty.mkdir()
    f = tmp_path / "README.md"
    f.write_text("x")
    for cmd in ("analyze", "records"):
        out = ht(cmd, bad)
        assert out.returncode == 3, out.stderr
        assert "ring-h-1.htr" in out.stderr and "ring-h-2.htr" in out.stderr
        assert ht(cmd, empty).returncode == 4
        out = ht(cmd, f)
        assert out.returncode == 4 and "is not a directory" in out.stderr


def test_dump_and_env_diff_of_a_missing_directory_create_nothing(tmp_path):
    """A mistyped RUN_DIR: exit 4 with the remedy, and no ``RUN_DIR/snapshots/...`` made
    there (``dump`` used to create it before failing; found by a blind job)."""
    missing = tmp_path / "run_b3"
    for cmd in ("dump", "env-diff"):
        out = ht(cmd, missing, cwd=str(tmp_path))
        assert out.returncode == 4 and "does not exist" in out.stderr, (cmd, out.stderr)
        assert not missing.exists(), "%s created %s" % (cmd, missing)


def test_dump_judges_staleness_with_the_given_stall_threshold(tmp_path):
    """``hangtrace dump --stall-s S`` (or HANGTRACE_STALL_S): a rank that made no progress
    for longer than S is stalled, not 'progressing' (the default threshold is 300 s)."""
    import json

    run = tmp_path / "run"
    code = (
        "from hangtrace import tracer; import time\ntracer.step(1)\nprint('up', flush=True)\ntime.sleep(60)\n"
    )
    p = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        text=True,
        env=base_env(run, RANK=0, LOCAL_RANK=0, WORLD_SIZE=1, HANGTRACE_MEM_INTERVAL_S="0.2"),
    )
    try:
        assert p.stdout.readline().strip() == "up"
        time.sleep(2.5)  # no progress since the step; memory samples keep coming
        kinds = {}
        for opts in ((), ("--stall-s", "1")):
            out = ht("dump", run, "--json", *opts)
            assert out.returncode == 0, out.stderr
            kinds[opts] = json.loads(out.stdout)["kind"]
        assert kinds[()] == "progressing", kinds
        assert kinds[("--stall-s", "1")] != "progressing", kinds
    finally:
        p.kill()
        p.wait()


def test_ring_appears_with_identity(tmp_path):
    """A ring is created under a hidden name and appears with its identity written: a
    process killed while creating it leaves no 'rank 0 :0' ghost."""
    path = str(tmp_path / "ring-x-1.htr")
    fd, mm, _ = F.create_ring(path, 16)
    try:
        with open(path, "rb") as f:
            h = R.read_header(f.read(F.HEADER_SIZE), path)
        assert h["pid"] == os.getpid() and h["host"] and h["proc_start_ticks"] > 0
        assert os.listdir(str(tmp_path)) == ["ring-x-1.htr"]
        with pytest.raises(FileExistsError):
            F.create_ring(path, 16)
        assert os.listdir(str(tmp_path)) == ["ring-x-1.htr"]
    finally:
        mm.close()
        os.close(fd)
    # what a process killed during creation leaves: a hidden file, invisible to readers
    (tmp_path / ".ring-x-2.htr.2.creating").write_bytes(bytes(F.HEADER_SIZE + 16 * F.SLOT_SIZE))
    out = ht("records", tmp_path)
    assert out.returncode == 0, out.stderr
    assert ":0 " not in out.stdout and "creating" not in out.stdout + out.stderr


def test_dump_ray_unreachable_address_fails_fast(tmp_path):
    t = time.time()
    out = ht("dump", "--ray", "--address", "127.0.0.1:%d" % free_port(), tmp_path, timeout=60)
    assert out.returncode == 2, out.stderr
    assert "cannot reach the Ray cluster" in out.stderr and "remedy:" in out.stderr
    assert time.time() - t < 30


def test_version_is_the_package_version():
    import hangtrace

    out = ht("--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "hangtrace %s" % hangtrace.__version__


#: A traced job with many records: phases, steps, and memory samples (every 10 ms and at
#: every phase boundary), so `records` output is far larger than a pipe's buffer.
BUSY = (
    "from hangtrace import tracer\n"
    "import time\n"
    "for i in range(3000):\n"
    "    with tracer.phase('train'):\n"
    "        tracer.step(i)\n"
    "    if i % 500 == 0:\n"
    "        time.sleep(0.05)\n"
)


@pytest.fixture(scope="module")
def busy_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("busy")
    p = subprocess.run(
        [sys.executable, "-c", BUSY],
        env=base_env(d, HANGTRACE_MEM_INTERVAL_S=0.01),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    return d


@pytest.mark.parametrize(
    "args", [["records", "--last", "0"], ["records", "--last", "0", "--json"], ["analyze", "--json"]]
)
def test_output_into_head_closes_quietly(busy_run, args):
    """`hangtrace records RUN | head -1`: no BrokenPipeError traceback, exit 141 (SIGPIPE's
    status, what a shell reports for `yes | head`), head gets the first line."""
    env = base_env(traced=False)
    env.pop("PYTHONUNBUFFERED", None)  # block-buffered, as in a user's shell
    for unbuffered in (False, True):
        if unbuffered:
            env["PYTHONUNBUFFERED"] = "1"
        cli = subprocess.Popen(
            [sys.executable, "-m", "hangtrace"] + args + [str(busy_run)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        head = subprocess.Popen(["head", "-1"], stdin=cli.stdout, stdout=subprocess.PIPE)
        cli.stdout.close()  # head alone reads the pipe
        first = head.communicate(timeout=120)[0].decode()
        err = cli.stderr.read().decode()
        rc = cli.wait(timeout=120)
        cli.stderr.close()
        assert first.strip(), err
        assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err, err
        if args[0] == "records":  # large output: the pipe was closed while we wrote
            assert rc == 141, err
        else:  # may fit in the pipe before head exits
            assert rc in (0, 141), err


def test_records_of_a_real_job_leave_memory_samples_out_unless_asked(busy_run):
    import json

    out = ht("records", busy_run, "--last", "50")
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("  #")]
    assert len(lines) == 50 and not [ln for ln in lines if " memory " in ln]
    assert "memory samples not shown: --memory shows them" in out.stdout
    out = ht("records", busy_run, "--last", "0", "--memory")
    assert out.returncode == 0, out.stderr
    assert " memory host (" in out.stdout and "not shown" not in out.stdout
    d = json.loads(ht("records", busy_run, "--last", "0", "--json").stdout)["processes"][0]
    assert (
        d["records"] and all(r["kind"] != "memory" for r in d["records"]) and d["memory_samples_hidden"] > 0
    )
    d = json.loads(ht("records", busy_run, "--last", "0", "--json", "--memory").stdout)["processes"][0]
    assert sum(r["kind"] == "memory" for r in d["records"]) > 0 and d["memory_samples_hidden"] == 0
