"""A snapshot's Flight Recorder request stops waiting for an agent that cannot answer (its
process holds the GIL in C code) soon after the others answered, instead of the whole
timeout (a blind job's every snapshot waited 3 s for such a rank). Real abstract sockets."""

import socket
import threading
import time

from hangtrace.hooks.torchdist.fr_agent import socket_name
from hangtrace.tracer.collect.frrequest import _ask


def _agent(run_dir, pid, answer):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(socket_name(run_dir, pid))
    s.listen(1)
    held = []

    def serve():
        c, _ = s.accept()
        c.recv(100)
        held.append(c)  # a silent agent keeps the connection open and never writes
        if answer:
            c.sendall(b"done\n")

    threading.Thread(target=serve, daemon=True).start()
    return s, held


def test_the_silent_agent_is_given_up_settle_s_after_the_latest_answer(tmp_path):
    run_dir = str(tmp_path)
    live = [_agent(run_dir, 900001, True), _agent(run_dir, 900002, False)]
    t0 = time.monotonic()
    got = _ask(run_dir, [900001, 900002, 900003], "tok", timeout_s=20.0, settle_s=0.3)
    took = time.monotonic() - t0
    assert got == {900001: "done"}
    assert took < 10.0, took  # not the 20 s timeout
    for s, held in live:
        s.close()
        for c in held:
            c.close()


def test_without_settle_every_answer_within_the_timeout_counts(tmp_path):
    run_dir = str(tmp_path)
    fast = _agent(run_dir, 900011, True)
    slow_sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    slow_sock.bind(socket_name(run_dir, 900012))
    slow_sock.listen(1)

    def slow():
        c, _ = slow_sock.accept()
        c.recv(100)
        time.sleep(0.8)
        c.sendall(b"done\n")
        time.sleep(0.5)
        c.close()

    threading.Thread(target=slow, daemon=True).start()
    got = _ask(run_dir, [900011, 900012], "tok", timeout_s=10.0)
    assert got == {900011: "done", 900012: "done"}
    fast[0].close()
    slow_sock.close()
