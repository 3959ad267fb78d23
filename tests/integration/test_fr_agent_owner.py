"""Only the job's owner drives a rank's Flight Recorder agent (issue 38, item 6): its
abstract Unix socket has no file permissions, so the agent checks the peer's credentials
(SO_PEERCRED) and refuses another user; and it writes at most one dump a second, however
many requests come."""

import os
import socket
import time

import pytest

from jobs import REPO, kill_all, start_ranks, wait_line

from hangtrace.hooks.torchdist.fr_agent import dump_path, meta_path, socket_name
from hangtrace.tracer.collect.frrequest import request_fr_dumps

SCRIPT = os.path.join(REPO, "tests", "integration", "scripts", "fr_agent_idle.py")
NOBODY = 65534


def _probe_as_nobody(address: bytes) -> str:
    """What another local user does: connect to the agent's abstract socket and send a
    token. Run in a forked child that drops to uid/gid nobody (no exec: the interpreter
    under root's home is not readable by nobody); the answer comes back through a pipe."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        answer = b"(error)"
        try:
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(10)
            s.connect(address)
            s.sendall(b"intruder-token\n")
            answer = s.recv(4096).strip() or b"(closed)"
        except BaseException as e:
            answer = repr(e).encode()
        finally:
            os.write(w, answer)
            os._exit(0)
    os.close(w)
    try:
        with os.fdopen(r, "rb") as f:
            return f.read().decode()
    finally:
        os.waitpid(pid, 0)


@pytest.fixture
def rank(tmp_path):
    run_dir = tmp_path / "run"
    procs = start_ranks(SCRIPT, 1, run_dir, PYTHONPATH=REPO)
    try:
        wait_line(procs[0], "READY")
        yield str(run_dir), procs[0].pid
    finally:
        kill_all(procs)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the probe as uid nobody (65534)")
def test_another_user_is_refused_and_triggers_no_dump(rank):
    run_dir, pid = rank
    host = socket.gethostname()
    assert _probe_as_nobody(socket_name(run_dir, pid)) == "refused"
    assert not os.path.exists(meta_path(run_dir, host, pid))  # nothing dumped, no token written
    # the owner (root here) is still answered
    assert request_fr_dumps(run_dir, [pid], timeout_s=20)
    assert os.path.exists(dump_path(run_dir, host, pid))


def test_a_flood_of_requests_costs_one_dump_a_second(rank):
    run_dir, pid = rank
    host = socket.gethostname()
    assert request_fr_dumps(run_dir, [pid], timeout_s=20)
    first = os.stat(dump_path(run_dir, host, pid)).st_mtime_ns
    t0 = time.monotonic()
    answered = [request_fr_dumps(run_dir, [pid], timeout_s=20) for _ in range(5)]
    quick = time.monotonic() - t0 < 1.0  # all five came within the second after the dump
    assert all(answered)  # each requester sees its own token answered
    if quick:
        assert os.stat(dump_path(run_dir, host, pid)).st_mtime_ns == first
    time.sleep(1.1)
    assert request_fr_dumps(run_dir, [pid], timeout_s=20)
    assert os.stat(dump_path(run_dir, host, pid)).st_mtime_ns > first  # a second later: a new dump
