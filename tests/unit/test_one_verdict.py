"""One verdict per incident (issue 38, item 2): the detector marks the later parts of an
incident, the verdict book keeps one verdict (a later, different one replaces it), the
cascade example is the same in every snapshot, and the auto-watcher's verdict reaches the
launching terminal."""

import os
import pty
import select
import subprocess
import sys
import time

import pytest

from hangtrace.tracer.diagnosis import Diagnosis, Kind
from hangtrace.tracer.pipeline import Result
from hangtrace.tracer.report.rankparagraph import cascade_example
from hangtrace.tracer.snapshot import Snapshot
from hangtrace.tracer.watch.detector import Watcher
from hangtrace.tracer.watch.terminal import tell_terminal
from hangtrace.tracer.watch.verdictbook import NEW, REVISED, SAME, VerdictBook, drop_repeat, mask

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from jobs import base_env  # noqa: E402

#: a rank that says 'ready', then on each line of stdin: 'beat' (a heartbeat: progress) or
#: 'die' (exit 3)
CHILD = (
    "import sys\n"
    "from hangtrace.tracer import api\n"
    "print('ready', flush=True)\n"
    "for line in sys.stdin:\n"
    "    if line.strip() == 'beat':\n"
    "        api.heartbeat(); print('beat', flush=True)\n"
    "    else:\n"
    "        sys.exit(3)\n"
)


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


@pytest.fixture
def ranks(tmp_path):
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD],
            env=base_env(tmp_path, RANK=r),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for r in (1, 2)
    ]
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def _tell(p, what):
    p.stdin.write(what + "\n")
    p.stdin.flush()
    if what == "beat":
        assert p.stdout.readline().strip() == "beat"
    else:
        p.wait(timeout=30)


def test_a_death_after_a_death_with_no_progress_between_follows_it(tmp_path, ranks):
    w = Watcher(str(tmp_path), stall_s=1000, phase_stall={}, clock=Clock())
    assert w.poll() is None
    _tell(ranks[0], "die")
    first = w.poll()
    assert first is not None and first.kind == "death" and not first.follows
    _tell(ranks[1], "die")
    second = w.poll()
    assert second is not None and second.kind == "death" and second.follows
    assert "RANK=2" in second.detail


def test_a_death_after_progress_is_a_new_incident(tmp_path, ranks):
    w = Watcher(str(tmp_path), stall_s=1000, phase_stall={}, clock=Clock())
    assert w.poll() is None
    _tell(ranks[0], "die")
    assert not w.poll().follows
    _tell(ranks[1], "beat")  # the job moved on after the death
    assert w.poll() is None
    _tell(ranks[1], "die")
    inc = w.poll()
    assert inc is not None and inc.kind == "death" and not inc.follows


def test_a_launcher_reacting_to_a_death_is_not_the_job_moving_on(tmp_path, ranks):
    """torchrun's agent records its workers' failure, then exits 1: the same incident. Only a
    rank that moves (here the rank of this process) ends it."""
    from hangtrace.hooks.record.recorder import Recorder
    from hangtrace.tracer.watch.helpergrace import HELPER_GRACE_S

    rec = Recorder(str(tmp_path), "t", 256, lambda *a, **k: None)
    rec.set_rank(0, 0, 1)  # joined a group: a rank; the children are its helpers
    rec.step(1)
    try:
        clk = Clock()
        w = Watcher(str(tmp_path), stall_s=1000, phase_stall={}, clock=clk)
        assert w.poll() is None
        _tell(ranks[0], "die")
        assert w.poll() is None  # a helper's death waits for its rank (helpergrace.py)
        clk.t += HELPER_GRACE_S
        assert not w.poll().follows
        _tell(ranks[1], "beat")  # not a rank: no progress of the job
        assert w.poll() is None
        _tell(ranks[1], "die")
        assert w.poll() is None  # held too
        clk.t += HELPER_GRACE_S
        inc = w.poll()
        assert inc is not None and inc.kind == "death" and inc.follows
        rec.heartbeat()  # the rank moves on: the next death is another incident
        assert w.poll() is None
        assert not w.in_incident
    finally:
        rec.close()


def test_the_survivors_stall_after_a_death_follows_it(tmp_path, ranks):
    clk = Clock()
    w = Watcher(str(tmp_path), stall_s=10, phase_stall={}, clock=clk)
    w.startup_stall_s = 10
    _tell(ranks[1], "beat")  # past start-up
    assert w.poll() is None
    _tell(ranks[0], "die")
    assert not w.poll().follows
    clk.t += 11
    inc = w.poll()
    assert inc is not None and inc.kind == "stall" and inc.follows


def _res(kind, culprits, summary, path="/r/snapshots/1"):
    return Result(
        Snapshot(run_dir="/r", path=path),
        Diagnosis(kind=kind, culprit_ranks=list(culprits), summary=summary),
        summary,
    )


HUNG = (
    "Stuck outside collectives: rank 2 is not in any collective; it is in main (train.py:71) > "
    "Queue.get (queues.py:103): kernel: read(fd %d (pipe:[%d])), no progress for %.1f s; pid %d, "
    "log /tmp/hangtrace-%s/watcher.log."
)


def test_the_same_incident_is_one_verdict_and_a_different_later_one_replaces_it():
    book = VerdictBook()
    a = _res(Kind.STUCK_OUTSIDE_COLLECTIVE, [2], HUNG % (24, 2162508, 5.2, 1234, "a"), "/r/snapshots/1")
    b = _res(Kind.STUCK_OUTSIDE_COLLECTIVE, [2], HUNG % (25, 2165143, 61.0, 4321, "b"), "/r/snapshots/2")
    assert book.judge(a, follows=False) == NEW
    assert book.judge(b, follows=True) == SAME  # only fds, inodes, ages, pids, paths differ
    assert book.snapshot == "/r/snapshots/1"  # the verdict in force keeps its snapshot
    c = _res(
        Kind.STUCK_OUTSIDE_COLLECTIVE, [1], (HUNG % (24, 1, 5.0, 1, "a")).replace("rank 2", "rank 1"), "/r/3"
    )
    assert book.judge(c, follows=True) == REVISED
    assert book.snapshot == "/r/3"
    assert book.judge(a, follows=False) == NEW  # after progress: another incident
    # what a verdict says is never masked: the rank, the seq, the frame's line
    assert mask("rank 2 in all_reduce seq 20 at train.py:71") == "rank 2 in all_reduce seq 20 at train.py:71"
    assert mask("5 other rank(s) sleep") == "5 other rank(s) sleep"


def test_a_repeated_verdicts_snapshot_is_removed_and_nothing_outside_snapshots(tmp_path):
    snaps = tmp_path / "snapshots"
    (snaps / "2").mkdir(parents=True)
    (snaps / "2" / "diagnosis.json").write_text("{}")
    other = tmp_path / "elsewhere"
    other.mkdir()
    res = Result(Snapshot(run_dir=str(tmp_path), path=str(snaps / "2")), Diagnosis(kind=Kind.UNKNOWN), "x")
    assert drop_repeat(res) and not (snaps / "2").exists() and snaps.exists()
    assert not drop_repeat(Result(Snapshot(run_dir=str(tmp_path), path=str(other)), res.diagnosis, "x"))
    assert other.exists()
    assert not drop_repeat(Result(Snapshot(run_dir=str(tmp_path), path=None), res.diagnosis, "x"))


def test_the_cascade_example_is_the_lowest_rank_of_one_event():
    t = 1_796_656_036_420_186_880
    casc = [
        {"rank": 2, "cause": "sigterm-external", "wall_ns": t},
        {"rank": 1, "cause": "sigterm-external", "wall_ns": t + 8_000_000},  # 8 ms later
        {"rank": 0, "cause": "sigterm-external", "wall_ns": t + 5_000_000_000},  # another event
        {"rank": 0, "cause": "exception", "wall_ns": t + 1},
    ]
    assert cascade_example(casc)["rank"] == 1
    assert cascade_example(list(reversed(casc[:2])))["rank"] == 1


def _read_all(fd, timeout=10.0):
    out, deadline = b"", time.time() + timeout
    while time.time() < deadline:
        r, _, _ = select.select([fd], [], [], 0.2)
        if not r:
            if out:
                break
            continue
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    return out.decode("utf-8", "replace")


def test_the_watchers_verdict_reaches_the_launching_terminal():
    master, slave = pty.openpty()
    try:
        res = _res(
            Kind.STUCK_OUTSIDE_COLLECTIVE, [2], HUNG % (24, 1, 5.0, 1, "a") + " Next: find the producer."
        )
        assert tell_terminal(os.ttyname(slave), res)
        text = _read_all(master)
        assert "==== hangtrace verdict (node watcher) ====" in text
        assert "rank 2 is not in any collective" in " ".join(text.split())
        assert "hangtrace analyze /r/snapshots/1" in text
    finally:
        os.close(master)
        os.close(slave)
    assert not tell_terminal(None, res)
    assert not tell_terminal("/dev/pts/999999", res)  # a closed terminal: nothing, no error


def test_the_auto_watcher_is_told_the_terminal_of_the_starting_process():
    code = (
        "import json, sys\n"
        "from hangtrace.hooks.autowatch import watcher_env\n"
        "print(json.dumps(watcher_env().get('HANGTRACE_WATCH_TTY')))\n"
    )
    master, slave = pty.openpty()
    try:
        p = subprocess.Popen(
            [sys.executable, "-c", code],
            env=base_env(traced=False),
            stdout=subprocess.PIPE,
            stderr=slave,
            text=True,
        )
        out, _ = p.communicate(timeout=60)
        assert out.strip() == '"%s"' % os.ttyname(slave)
    finally:
        os.close(master)
        os.close(slave)
    p = subprocess.run(
        [sys.executable, "-c", code],
        env=base_env(traced=False),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.stdout.strip() == "null"  # stderr a pipe: no terminal


def test_writing_to_the_terminal_never_makes_it_the_watchers_controlling_terminal():
    """The watcher is a session leader: opening the device must not make it its
    controlling terminal (O_NOCTTY)."""
    master, slave = pty.openpty()
    name = os.ttyname(slave)
    code = (
        "import os, sys\n"
        "os.setsid()\n"
        "from hangtrace.tracer.pipeline import Result\n"
        "from hangtrace.tracer.diagnosis import Diagnosis, Kind\n"
        "from hangtrace.tracer.snapshot import Snapshot\n"
        "from hangtrace.tracer.watch.terminal import tell_terminal\n"
        "r = Result(Snapshot(run_dir='/r', path='/r/s'), Diagnosis(kind=Kind.UNKNOWN), 'x')\n"
        "assert tell_terminal(sys.argv[1], r)\n"
        "try:\n"
        "    os.close(os.open('/dev/tty', os.O_RDWR))\n"
        "    print('ctty')\n"
        "except OSError:\n"
        "    print('no ctty')\n"
    )
    try:
        p = subprocess.run(
            [sys.executable, "-c", code, name],
            env=base_env(traced=False),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert p.returncode == 0, p.stderr
        assert p.stdout.strip() == "no ctty"
        assert "==== hangtrace verdict" in _read_all(master)
    finally:
        os.close(master)
        os.close(slave)
