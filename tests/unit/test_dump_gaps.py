"""A live dump that cannot collect everything says what it missed and analyses the rest
(issue 38, "bad input"): an agent that takes the request and does not answer, a rank
that exits during the dump, a run directory deleted during the dump. Real sockets, real
processes, a real deletion; the rings are real ring files (``test_pipeline._rank``)."""

import os
import shutil
import socket
import subprocess
import sys
import threading
import time

from hangtrace.hooks.torchdist.fr_agent import socket_name
from hangtrace.tracer import pipeline
from hangtrace.tracer.collect.frrequest import fr_into_snapshot
from hangtrace.tracer.collect.livestacks import gap_lines, stacks_for
from hangtrace.tracer.collect.ringprocs import HOST
from hangtrace.tracer.snapshot import ProcessInfo

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_pipeline import _rank  # noqa: E402


def _mute_agent(run_dir, pid):
    """An agent's socket for ``pid`` that takes every request and never answers."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(socket_name(run_dir, pid))
    srv.listen(8)
    held = []

    def accept():
        while True:
            try:
                held.append(srv.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    return srv, held


def _child():
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_an_agent_that_does_not_answer_is_named_and_one_without_an_agent_is_not(tmp_path):
    run_dir = str(tmp_path / "run")
    os.makedirs(os.path.join(run_dir, "fr"))
    mute, other = _child(), _child()
    srv, held = _mute_agent(run_dir, mute.pid)
    try:
        silent = set()
        t0 = time.monotonic()
        got = fr_into_snapshot(run_dir, [mute.pid, other.pid], str(tmp_path / "snap"), 0.5, silent=silent)
        assert got == [] and silent == {mute.pid}
        assert time.monotonic() - t0 < 3
        procs = [
            ProcessInfo(host=HOST, pid=mute.pid, rank=1, state="alive", stacks=[]),
            ProcessInfo(host=HOST, pid=other.pid, rank=2, state="alive", stacks=[]),
        ]
        lines = gap_lines(procs, HOST, silent, 0.5)
        assert lines == [
            "rank 1 (pid %d): its Flight Recorder agent did not answer within 0.5 s (a process "
            "stopped, exiting, or holding the GIL in C code); analysed without torch's record of "
            "its collectives" % mute.pid
        ]
    finally:
        srv.close()
        for c in held:
            c.close()
        for p in (mute, other):
            p.kill()
            p.wait()


def test_a_rank_that_exits_during_the_dump_is_named_with_its_missing_stacks(tmp_path):
    gone = _child()
    p = ProcessInfo(host=HOST, pid=gone.pid, rank=3, state="alive")  # alive when its ring was read
    gone.kill()
    gone.wait()  # ... and gone when its stacks are taken
    (q,) = stacks_for([p], False, str(tmp_path))
    assert q.stacks is None and q.stack_error
    (line,) = gap_lines([q], HOST, set(), 3.0)
    assert line.startswith("rank 3 (pid %d): no stacks (" % gone.pid), line
    assert line.endswith(" - it exited during the dump; analysed from its ring alone"), line
    # a process of another host, or one with its stacks, is no gap
    assert (
        gap_lines([ProcessInfo(host="elsewhere", pid=gone.pid, rank=3, state="alive")], HOST, {gone.pid}, 3)
        == []
    )


def _deleting_dump(tmp_path, monkeypatch, stall_s):
    """4 real rings (rank 2 exited, ranks 0, 1, 3 blocked in its all_reduce); the run
    directory is deleted while the dump takes its stacks (between the window's readings)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for r in range(4):
        _rank(run_dir, r, 4, 10, blocked=r != 2, exit_code=0 if r == 2 else None)

    def deleting(procs, native, rd):  # the deletion lands while the stacks are taken
        shutil.rmtree(run_dir)
        return procs

    monkeypatch.setattr("hangtrace.tracer.collect.rings.stacks_for", deleting)
    time.sleep(0.1)  # (the rings' last progress older than a stall threshold of 0.01 s)
    res = pipeline.dump_live(str(run_dir), "request", window_s=1.0, stall_s=stall_s)
    return run_dir, res


def test_a_run_directory_deleted_during_the_dump_is_said_and_not_made_again(tmp_path, monkeypatch):
    run_dir, res = _deleting_dump(tmp_path, monkeypatch, stall_s=300)
    d = res.diagnosis
    assert not run_dir.exists()  # the dump did not make the deleted directory again
    # the window could not see whether the ranks were still: no hang before the stall threshold
    assert d.kind == "progressing", d.summary
    assert d.summary.startswith("Not judged over a window: the ring files of 4 process(es) vanished"), (
        d.summary
    )
    assert d.details["window"]["unread_processes"] == ["node-%d:%d" % (r, 50000 + r) for r in range(4)]
    assert any("could not be stored" in e and str(run_dir) in e for e in res.snapshot.errors), (
        res.snapshot.errors
    )


def test_past_the_stall_threshold_the_rest_is_still_analysed(tmp_path, monkeypatch):
    _run_dir, res = _deleting_dump(tmp_path, monkeypatch, stall_s=0.01)
    d = res.diagnosis
    assert (d.kind, d.culprit_ranks) == ("skipped-collective", [2]), d.summary
    assert any("could not be read at the window's second reading" in e for e in d.evidence), d.evidence


def test_many_processes_without_stacks_are_one_line():
    procs = [
        ProcessInfo(
            host=HOST, pid=os.getpid(), rank=r, state="alive", stack_error="py-spy: permission denied"
        )
        for r in range(20)
    ]
    (line,) = gap_lines(procs, HOST, set(), 3.0)
    assert line.startswith(
        "20 processes alike, the first: rank 0 (pid %d): no stacks (py-spy: " % os.getpid()
    )
    assert len(gap_lines(procs[:8], HOST, set(), 3.0)) == 8
