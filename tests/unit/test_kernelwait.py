"""What the kernel says a blocked thread waits for (collect/kernelwait.py), read from real
processes: a FIFO open with no reader (a stalled NFS write's stand-in), a socket recv with
no answer, a parent waiting for its child; and the decoding of odd lines."""

import os
import socket
import subprocess
import sys
import time

import pytest

from hangtrace.tracer.collect import kernelwait as K
from hangtrace.tracer.collect import syscalls as SC
from hangtrace.tracer.collect import stacks as S

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")


def _blocked(pid, tid, timeout=10.0, passing=("futex",)):
    """The first call ``tid`` is seen blocked in, other than the ``passing`` ones."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        k = K.thread_wait(pid, tid)
        if k is not None and k["syscall"] not in passing:
            return k
        time.sleep(0.05)
    raise AssertionError("pid %d never blocked in a call (last: %r)" % (pid, K.thread_wait(pid, tid)))


def test_a_fifo_open_names_the_call_and_the_path(tmp_path):
    fifo = str(tmp_path / "shard1.pt")
    os.mkfifo(fifo)
    p = subprocess.Popen([sys.executable, "-c", "open(%r, 'wb')" % fifo])
    try:
        k = _blocked(p.pid, p.pid)
        assert k["syscall"] in ("openat", "open") and k["args"][-1] == repr(fifo), k
        if "wchan" in k:  # hidden on some kernels (kptr_restrict)
            assert k["wchan"] == "wait_for_partner", k
    finally:
        p.kill()
        p.wait()


def test_a_socket_recv_names_the_peer_and_py_spy_threads_carry_it():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]
    code = (
        "import socket, threading\n"
        "c = socket.create_connection(('127.0.0.1', %d))\n"
        "threading.Thread(target=c.recv, args=(10,), name='asker').start()\n" % port
    )
    p = subprocess.Popen([sys.executable, "-c", code])
    try:
        conn, _ = srv.accept()
        tid = None
        t0 = time.monotonic()
        while tid is None and time.monotonic() - t0 < 10:
            tids = [int(t) for t in os.listdir("/proc/%d/task" % p.pid) if int(t) != p.pid]
            tid = tids[0] if tids else None
        k = _blocked(p.pid, tid)
        assert k["syscall"] in ("recvfrom", "read", "recvmsg"), k
        assert k["args"] and "TCP 127.0.0.1:" in k["args"][0] and "-> 127.0.0.1:%d" % port in k["args"][0], k
        # the other end is this test process's socket: named by pid (the host's TCP table)
        assert "peer pid %d (" % os.getpid() in k["args"][0], k
        if S.pyspy_path():
            r = S.dump_one(p.pid)
            asker = [t for t in r["threads"] or () if t.get("thread_name") == "asker"]
            assert asker and asker[0]["kernel"]["syscall"] == k["syscall"], r
    finally:
        p.kill()
        p.wait()
        srv.close()


def test_a_parent_waiting_for_its_child_names_the_pid_and_lists_the_child():
    p = subprocess.Popen(
        [sys.executable, "-c", "import subprocess; subprocess.call(['cat'], stdin=subprocess.PIPE)"]
    )
    try:
        # (a loaded machine can catch the parent in vfork, blocked until cat execs: CI, 2026-12-05)
        k = _blocked(p.pid, p.pid, passing=("futex", "vfork", "clone", "clone3"))
        assert k["syscall"] in ("wait4", "waitid"), k
        t0 = time.monotonic()
        kids = K.children(p.pid)
        while time.monotonic() - t0 < 10 and not (
            kids and (kids[0].get("kernel") or {}).get("syscall") == "read"
        ):
            time.sleep(0.05)  # (cat may still be starting when its parent already waits)
            kids = K.children(p.pid)
        assert len(kids) == 1 and kids[0]["argv"] == ["cat"], kids
        assert k["args"] == ["pid %d" % kids[0]["pid"]], (k, kids)
        ck = kids[0].get("kernel") or {}
        assert ck.get("syscall") == "read" and "pipe:[" in ck["args"][0], kids  # cat reads its pipe
    finally:
        p.kill()
        p.wait()


def test_decode_odd_lines_and_unknown_numbers():
    assert K.decode(os.getpid(), "running") is None
    assert K.decode(os.getpid(), "-1 0x7ffd 0x0") is None
    assert K.decode(os.getpid(), "garbage") is None
    assert K.decode(os.getpid(), "") is None
    k = K.decode(os.getpid(), "999 0x0 0x0 0x0 0x0 0x0 0x0 0x0 0x0", table={})
    assert k == {"syscall": "syscall 999", "nr": 999, "args": []}
    # aarch64's numbers: read(fd) is 63; fd 0 of this process names something
    k = K.decode(os.getpid(), "63 0x0 0x0 0x0 0x0 0x0 0x0 0x0 0x0", table=SC.syscall_table("aarch64"))
    assert k["syscall"] == "read" and k["args"][0].startswith("fd 0"), k
    # a process that is gone: nothing, no exception
    assert K.thread_wait(2**22 + 1, 2**22 + 1) is None
    assert K.children(2**22 + 1) == []
    assert K.annotate(2**22 + 1, [{"active": False, "os_thread_id": 2**22 + 1}]) == [
        {"active": False, "os_thread_id": 2**22 + 1}
    ]


def test_a_poll_interrupted_by_py_spy_keeps_its_call_and_files():
    """py-spy's ptrace stop interrupts a poll(2); the thread resumes in restart_syscall,
    whose arguments are gone. Read after the dump, the call said 'syscall 219' (a blind
    job's rank in subprocess.run: "kernel: syscall 219"); the calls read before the dump
    name poll and its pipe."""
    code = "import os, select; r, w = os.pipe(); q = select.poll(); q.register(r); q.poll()"
    p = subprocess.Popen([sys.executable, "-c", code])
    try:
        k = _blocked(p.pid, p.pid)
        assert k["syscall"] in ("poll", "ppoll") and "pipe:[" in k["args"][0], k
        if not S.pyspy_path():
            pytest.skip("py-spy not installed")
        r = S.dump_one(p.pid)
        main = [t for t in r["threads"] or () if t.get("os_thread_id") == p.pid]
        assert main and main[0]["kernel"]["syscall"] == k["syscall"], r
        assert "pipe:[" in main[0]["kernel"]["args"][0], main[0]["kernel"]
        now = K.thread_wait(p.pid, p.pid)
        assert now is not None and now["syscall"] in (SC.RESTART, k["syscall"]), (
            now
        )  # named, not 'syscall 219'
    finally:
        p.kill()
        p.wait()
