"""Fault injection: a broken run directory or a failing recorder never changes the job.

The job (scripts/fault_job.py, 2 gloo ranks) must print its normal result and exit 0
whatever happens to the flight record: unwritable directory, read-only mount, disk full
before the ring exists or while its string table grows, recorder raising in every call.
"""

import os
import re
import subprocess

import pytest

from jobs import kill_all, start_ranks
from hangtrace.tracer.ring import layout as F
from hangtrace.tracer.ring import reader as R

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, "scripts", "fault_job.py")
ITERS = 50


def expected_stdout(rank):
    return "result %d %.1f [{'rank': 0}, {'rank': 1}]\n" % (rank, 3.0 * ITERS)


def run_job(run_dir, *args, **extra):
    """Run the 2-rank job; return [(returncode, stdout, stderr)] per rank."""
    procs = start_ranks(JOB, 2, run_dir, args=("--iters", str(ITERS)) + args, **extra)
    try:
        res = []
        for p in procs:
            out, err = p.communicate(timeout=120)
            res.append((p.returncode, out, err))
        return res
    finally:
        kill_all(procs)


def assert_job_unchanged(results):
    for rank, (rc, out, err) in enumerate(results):
        assert rc == 0, err
        assert out == expected_stdout(rank), out
        assert "Bus error" not in err and "Traceback" not in err, err


def hangtrace_lines(err):
    return [l for l in err.splitlines() if "hangtrace" in l.lower()]


class Tmpfs:
    """A tmpfs mounted at ``path`` (root only); ``umount()`` in finally."""

    def __init__(self, path, size, ro=False):
        self.path = str(path)
        os.makedirs(self.path, exist_ok=True)
        opts = "size=%s,mode=0755%s" % (size, ",ro" if ro else "")
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", opts, "tmpfs", self.path], capture_output=True, text=True
        )
        if r.returncode != 0:
            pytest.skip(
                "cannot mount a tmpfs here (%s): needs root or CAP_SYS_ADMIN"
                % (r.stderr.strip() or r.returncode)
            )

    def fill(self, name="filler"):
        """Write zeros into ``name`` until the file system is full."""
        fd = os.open(os.path.join(self.path, name), os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while True:
                os.write(fd, bytes(4096))
        except OSError:
            pass
        finally:
            os.close(fd)

    def umount(self):
        if subprocess.run(["umount", self.path], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", self.path], capture_output=True)


@pytest.fixture
def mounts():
    made = []
    try:
        yield made
    finally:
        for m in made:
            m.umount()


def test_run_dir_under_a_regular_file(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    results = run_job(blocker / "sub")
    assert_job_unchanged(results)
    for rc, out, err in results:
        lines = hangtrace_lines(err)
        assert len(lines) == 1, err
        assert "Not a directory" in lines[0] and "remedy: set HANGTRACE_DIR" in lines[0]
    assert blocker.read_text() == "not a directory"


def test_read_only_run_dir(tmp_path, mounts):
    mnt = tmp_path / "ro"
    mounts.append(Tmpfs(mnt, "4m", ro=True))
    results = run_job(mnt)
    assert_job_unchanged(results)
    for rc, out, err in results:
        lines = hangtrace_lines(err)
        assert len(lines) == 1, err
        assert "Read-only file system" in lines[0] and "remedy:" in lines[0]
    assert os.listdir(str(mnt)) == []


def test_disk_full_before_the_ring_exists(tmp_path, mounts):
    mnt = tmp_path / "full"
    m = Tmpfs(mnt, "1m")
    mounts.append(m)
    m.fill()
    results = run_job(mnt)
    assert_job_unchanged(results)
    for rc, out, err in results:
        lines = hangtrace_lines(err)
        assert len(lines) == 1, err
        assert "No space left on device" in lines[0] and "remedy:" in lines[0]
    # nothing half-made is left behind
    assert sorted(os.listdir(str(mnt))) == ["filler"]


def test_disk_fills_while_the_string_table_grows(tmp_path, mounts):
    mnt = tmp_path / "later"
    m = Tmpfs(mnt, "2m")
    mounts.append(m)
    # small rings (64 slots) fit; 3000 distinct phase names (~170 KB) need more string
    # table than the filled disk can give
    results = run_job(mnt, "--fill", str(mnt / "filler"), "--phases", "3000", HANGTRACE_SLOTS=64)
    assert_job_unchanged(results)
    for rc, out, err in results:
        assert hangtrace_lines(err) == [], err
    rings = [R.read_ring(os.path.join(str(mnt), n)) for n in os.listdir(str(mnt)) if n.startswith("ring-")]
    assert len(rings) == 2
    for r in rings:
        # the ring stays readable; the last records are the phases (names lost, '?'/None)
        assert r.header["state"] == F.ST_EXITED and r.header["exit_code"] == 0
        assert r.header["step"] == 2999
        assert len(r.records) == 64
        # the table stopped growing: the last phase names were dropped, not half-written
        assert r.header["strtab_used"] < 3000 * 40
        assert [x["phase"] for x in r.records if x["kind"] == "phase_enter"][-1] is None
        assert r.warnings == []
    # the log may itself not fit on the full disk; when it does, each problem is said once
    log_path = os.path.join(str(mnt), "hangtrace.log")
    log = open(log_path).read() if os.path.exists(log_path) else ""
    for pid in {int(p) for p in re.findall(r"pid=(\d+)", log)}:
        assert len(re.findall(r"pid=%d cannot grow the string table" % pid, log)) <= 1, log


def test_recorder_failing_in_every_collective(tmp_path):
    run_dir = tmp_path / "run"
    results = run_job(run_dir, HANGTRACE_FAULT_INJECT="recorder")
    assert_job_unchanged(results)
    for rc, out, err in results:
        assert hangtrace_lines(err) == [], err
    with open(str(run_dir / "hangtrace.log")) as f:
        log = f.read().splitlines()
    pids = sorted({int(re.search(r"pid=(\d+)", l).group(1)) for l in log})
    assert len(pids) == 2, log
    for pid in pids:
        mine = [l for l in log if "pid=%d " % pid in l]
        ar = [l for l in mine if "recording all_reduce failed" in l]
        assert len(ar) == 1, mine  # 50 failing calls, one line
        assert "hangtrace test fault: recorder failure" in ar[0]
        assert len([l for l in mine if "recording all_gather_object failed" in l]) == 1
        assert len(mine) <= 6, mine  # recorder choice, FR setting, tensor layout, the two failures, ...
    # the rings still carry the lifecycle and group records
    for name in os.listdir(str(run_dir)):
        if name.startswith("ring-"):
            r = R.read_ring(str(run_dir / name))
            assert r.header["state"] == F.ST_EXITED
            assert [x for x in r.records if x["kind"] == "collective"] == []
            assert r.groups and r.groups[0]["ranks"] == [0, 1]
