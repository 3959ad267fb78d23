"""py-spy stacks, the faulthandler fallback and discovery on real live processes."""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest

from hangtrace.tracer import config
from hangtrace.tracer.collect import discover
from hangtrace.tracer.collect import stacks
from hangtrace.tracer.collect import faulthandler
from hangtrace.tracer.stackmodel import faulthandler_text
from hangtrace.tracer.stackmodel import threads as stackthreads

ok, why = stacks.pyspy_available()
needs_pyspy = pytest.mark.skipif(not ok, reason=why)
needs_ptrace = pytest.mark.skipif(stacks.ptrace_problem() is not None, reason=str(stacks.ptrace_problem()))

QUEUE_CHILD = """
import queue
print("ready", flush=True)
queue.Queue().get()
"""

SLEEP_CHILD = """
import time
def napping():
    time.sleep(300)
print("ready", flush=True)
napping()
"""

FH_CHILD = """
import faulthandler, signal, sys, threading
dump = open(sys.argv[1], "a")
faulthandler.register(signal.SIGUSR2, file=dump, all_threads=True)
lock = threading.Lock()
lock.acquire()
def wait_for_lock():
    lock.acquire()          # blocks forever in C
print("ready", flush=True)
wait_for_lock()
"""

PLAIN_CHILD = """
import sys
print("ready", flush=True)
sys.stdin.read()
"""


def start(code, *args, env=None):
    """Start a Python child and wait for its 'ready' line (no fixed sleeps)."""
    full_env = dict(os.environ)
    full_env.pop(config.ENABLE, None)
    full_env.update(env or {})
    p = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)] + list(args),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=full_env,
    )
    line = p.stdout.readline()
    assert line.strip() == "ready", "child did not start: %r" % line
    return p


def stop(procs):
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for f in (p.stdin, p.stdout):
            if f:
                f.close()


def names(threads):
    return [(f["name"], os.path.basename(f["filename"])) for t in threads for f in t["frames"]]


@needs_pyspy
@needs_ptrace
def test_dump_stacks_parallel(tmp_path):
    procs = []
    try:
        q = start(QUEUE_CHILD)
        procs.append(q)
        s = start(SLEEP_CHILD)
        procs.append(s)
        fh = start(FH_CHILD, str(tmp_path / "fh.txt"))
        procs.append(fh)
        res = stacks.dump_stacks([q.pid, s.pid, fh.pid, q.pid], timeout_s=20)
        assert sorted(res) == sorted([q.pid, s.pid, fh.pid])
        for r in res.values():
            assert r["error"] is None, r
            assert r["source"] == "py-spy"
        assert ("Queue.get", "queue.py") in names(res[q.pid]["threads"])
        assert stackthreads.top_frames(res[s.pid]["threads"])[0].startswith("napping (")
        assert ("wait_for_lock", "<string>") in names(res[fh.pid]["threads"])
        main = stackthreads.main_thread(res[q.pid]["threads"])
        assert main["thread_name"] == "MainThread" and main["os_thread_id"] == q.pid
    finally:
        stop(procs)


@needs_pyspy
@needs_ptrace
def test_dump_stacks_native(tmp_path):
    procs = []
    try:
        s = start(SLEEP_CHILD)
        procs.append(s)
        r = stacks.dump_stacks([s.pid], native=True, timeout_s=30)[s.pid]
        assert r["error"] is None, r
        frames = stackthreads.main_thread(r["threads"])["frames"]
        assert any(f["native"] for f in frames)
        assert any(f["name"] == "napping" and not f["native"] for f in frames)
    finally:
        stop(procs)


@needs_pyspy
def test_vanished_and_non_python_pids():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    gone = p.pid  # reaped: the pid no longer exists
    z = subprocess.Popen([sys.executable, "-c", "pass"])
    procs = [z]
    try:
        zp = subprocess.Popen(["sleep", "300"], stdout=subprocess.DEVNULL)
        procs.append(zp)
        # wait until z has exited but is not reaped (zombie), without a fixed sleep
        os.waitid(os.P_PID, z.pid, os.WEXITED | os.WNOWAIT)
        res = stacks.dump_stacks([gone, z.pid, zp.pid], timeout_s=20)
        assert res[gone]["error"].startswith("process vanished"), res[gone]
        assert res[gone]["threads"] is None
        assert res[z.pid]["error"].startswith("process vanished") and "zombie" in res[z.pid]["error"]
        if stacks.ptrace_problem() is None:
            assert "not look like a Python process" in res[zp.pid]["error"], res[zp.pid]
    finally:
        stop(procs)


def _blocked(pid, polls=4, timeout=20):
    """Wait until ``pid`` has been asleep (state S) for ``polls`` consecutive 50 ms polls."""
    import time

    deadline, n = time.time() + timeout, 0
    while time.time() < deadline and n < polls:
        with open("/proc/%d/stat" % pid) as f:
            n = n + 1 if f.read().rsplit(")", 1)[1].split()[0] == "S" else 0
        time.sleep(0.05)


def test_faulthandler_round_trip(tmp_path):
    dump = tmp_path / "fh.txt"
    procs = []
    try:
        fh = start(FH_CHILD, str(dump))
        procs.append(fh)
        _blocked(fh.pid)  # "ready" comes just before the blocking call: wait until it sleeps
        assert faulthandler.signal_caught(fh.pid, signal.SIGUSR2)
        assert not faulthandler.signal_caught(fh.pid, signal.SIGUSR1)
        # refuses when the caller does not vouch for the handler: no signal sent
        assert (
            faulthandler.request_faulthandler_dump(fh.pid, signal.SIGUSR2, str(dump), registered=False)
            is None
        )
        assert not dump.exists() or dump.stat().st_size == 0
        # refuses when /proc says no handler (SIGUSR1 at SIG_DFL would kill it)
        assert (
            faulthandler.request_faulthandler_dump(fh.pid, signal.SIGUSR1, str(dump), registered=True) is None
        )
        assert fh.poll() is None
        for _ in range(2):  # twice: the second call must return only the new dump
            threads = faulthandler.request_faulthandler_dump(
                fh.pid, signal.SIGUSR2, str(dump), timeout_s=10, registered=True
            )
            assert threads, dump.read_text()
            assert stackthreads.top_frames(threads, n=1) == ["wait_for_lock (<string>:8)"]
            assert fh.poll() is None
        assert len(faulthandler_text.parse_faulthandler_dumps(dump.read_text())) == 2
    finally:
        stop(procs)


def test_faulthandler_request_on_plain_process(tmp_path):
    procs = []
    try:
        p = start(PLAIN_CHILD)
        procs.append(p)
        assert (
            faulthandler.request_faulthandler_dump(
                p.pid, signal.SIGUSR2, str(tmp_path / "x"), registered=True
            )
            is None
        )
        assert p.poll() is None  # still alive: nothing was sent
    finally:
        stop(procs)


def test_discover_finds_rank(tmp_path):
    procs = []
    try:
        a = start(
            PLAIN_CHILD,
            env={"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "TORCHELASTIC_RUN_ID": "ht-test-run"},
        )
        procs.append(a)
        helper = start(
            PLAIN_CHILD,
            env=dict(config.helper_env(), RANK="3", WORLD_SIZE="4", TORCHELASTIC_RUN_ID="ht-test-run"),
        )
        procs.append(helper)
        found = discover.find_torch_processes()
        mine = [d for d in found if d["run_id"] == "ht-test-run"]
        assert [d["pid"] for d in mine] == [a.pid]  # helper skipped
        d = mine[0]
        assert (d["rank"], d["local_rank"], d["world_size"]) == (3, 1, 4)
        assert d["env"]["RANK"] == "3" and d["python"] is True
        assert d["host"] and d["cmdline"][0] == sys.executable
        assert os.getpid() not in [x["pid"] for x in found]
        # explicit pids: taken as given, gone ones reported in .skipped
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait()
        found = discover.find_torch_processes(pids=[a.pid, gone.pid])
        assert [x["pid"] for x in found] == [a.pid]
        assert found.skipped == [{"pid": gone.pid, "reason": "no such process"}]
        zombie = subprocess.Popen([sys.executable, "-c", "pass"])
        procs.append(zombie)
        os.waitid(os.P_PID, zombie.pid, os.WEXITED | os.WNOWAIT)
        found = discover.find_torch_processes(pids=[zombie.pid])
        assert list(found) == [] and "zombie" in found.skipped[0]["reason"]
    finally:
        stop(procs)


def test_discover_prefers_worker_over_wrapper_and_forks(tmp_path):
    """A `sh -c python ...` wrapper and a forked child share RANK; only the rank remains."""
    procs = []
    code = textwrap.dedent("""
        import os, sys
        r, w = os.pipe()
        if os.fork() == 0:          # forked helper (like a DataLoader worker)
            os.close(w)             # exits by itself (EOF) when the parent dies
            os.read(r, 1)
            os._exit(0)
        print("ready", os.getpid(), flush=True)
        sys.stdin.read()
    """)
    script = tmp_path / "worker.py"
    script.write_text(code)
    env = dict(os.environ, RANK="5", WORLD_SIZE="8", TORCHELASTIC_RUN_ID="ht-wrap-run")
    env.pop(config.ENABLE, None)
    try:
        p = subprocess.Popen(
            ["/bin/sh", "-c", "%s %s; true" % (sys.executable, script)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        procs.append(p)
        line = p.stdout.readline().split()
        assert line[0] == "ready"
        worker = int(line[1])
        every = [d for d in discover.find_torch_processes(include_all=True) if d["run_id"] == "ht-wrap-run"]
        assert len(every) == 3, every  # sh, worker, forked child
        kept = [d for d in discover.find_torch_processes() if d["run_id"] == "ht-wrap-run"]
        assert [d["pid"] for d in kept] == [worker]
    finally:
        for d in discover.find_torch_processes(include_all=True):
            if d["run_id"] == "ht-wrap-run":
                try:
                    os.kill(d["pid"], signal.SIGKILL)
                except ProcessLookupError:
                    pass
        stop(procs)


@needs_pyspy
@pytest.mark.skipif(
    os.geteuid() != 0 or not (shutil.which("capsh") and shutil.which("setpriv")),
    reason="needs root, capsh and setpriv to create a ptrace-denied situation",
)
def test_permission_denied_names_remedy():
    """Root without CAP_SYS_PTRACE reading another uid's process: a real ptrace refusal."""
    procs = []
    try:
        target = subprocess.Popen(
            [
                "setpriv",
                "--reuid",
                "65534",
                "--regid",
                "65534",
                "--clear-groups",
                "sh",
                "-c",
                "echo ready; exec sleep 300",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(target)
        assert target.stdout.readline().strip() == "ready"
        probe = (
            "import json, sys\n"
            "from hangtrace.tracer.collect import stacks\n"
            "r = stacks.dump_stacks([%d])[%d]\n"
            "print(json.dumps([r['error'], r['remedy'], stacks.ptrace_problem(%d)]))\n"
            % (target.pid, target.pid, target.pid)
        )
        root = os.path.dirname(
            os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(stacks.__file__))))
        )
        env = dict(os.environ, PYTHONPATH=root)
        out = subprocess.run(
            ["capsh", "--drop=cap_sys_ptrace", "--", "-c", 'exec "$0" -c "$1"', sys.executable, probe],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert out.returncode == 0, out.stderr
        error, remedy, predicted = json.loads(out.stdout.strip().splitlines()[-1])
        assert error.startswith("permission denied reading pid %d" % target.pid), error
        for text in (error, remedy, predicted):
            for needle in (
                "CAP_SYS_PTRACE",
                "sysctl kernel.yama.ptrace_scope=0",
                "docker run --cap-add SYS_PTRACE",
            ):
                assert needle in text
    finally:
        stop(procs)
