"""Signals and exits of traced processes: stacks files, unchanged exit status, process states.

Every traced program is compared with the same program run untraced (started side by
side, so the comparison costs no extra wall time).
"""

import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from jobs import base_env, kill_all, start_ranks, wait_line, wait_until
from hangtrace.tracer.ring import reader as R

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, "scripts")
PROG = os.path.join(SCRIPTS, "sig_prog.py")
HOST = socket.gethostname()


def start(mode, run_dir, traced=True):
    env = base_env(run_dir, traced)
    return subprocess.Popen(
        [sys.executable, PROG, mode], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finish(p, timeout=60):
    out, err = p.communicate(timeout=timeout)
    return p.returncode, out, err


def stacks_file(run_dir, kind, pid):
    return os.path.join(str(run_dir), "stacks", "%s-%s-%d.txt" % (kind, HOST, pid))


def read(path):
    with open(path) as f:
        return f.read()


def records_json(run_dir):
    env = base_env(None, traced=False)
    p = subprocess.run(
        [sys.executable, "-m", "hangtrace", "records", str(run_dir), "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    return {q["pid"]: q for q in d["processes"]}, d["errors"]


def main_thread_blocked(pid):
    """True when the main thread of ``pid`` sleeps in the kernel (state S)."""
    try:
        with open("/proc/%d/task/%d/stat" % (pid, pid)) as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "S"
    except OSError:
        return False


@pytest.mark.parametrize("mode", ["sleep", "thread_signal"])
def test_sigterm_while_sleeping(tmp_path, mode):
    run_dir = tmp_path / "run"
    procs = [start(mode, run_dir), start(mode, tmp_path / "off", traced=False)]
    try:
        for p in procs:
            wait_line(p, "ready")
            wait_until(lambda: main_thread_blocked(p.pid))
            p.send_signal(signal.SIGTERM)
        (rc, out, err), (rc0, out0, err0) = [finish(p) for p in procs]
    finally:
        kill_all(procs)
    assert rc0 == -signal.SIGTERM
    assert rc == rc0
    assert (out, err) == (out0, err0)
    text = read(stacks_file(run_dir, "sigterm", procs[0].pid))
    assert "Current thread" in text or "Thread 0x" in text
    assert "in wait_in_sleep" in text and "sig_prog.py" in text
    procs_, errors = records_json(run_dir)
    q = procs_[procs[0].pid]
    assert q["state"] == "killed" and q["exit_code"] is None
    assert "sigterm" in q["signals"]
    assert_sender(text, q)
    assert not os.path.exists(tmp_path / "off")


def test_sigterm_with_the_programs_own_handler(tmp_path):
    run_dir = tmp_path / "run"
    procs = [start("handler", run_dir), start("handler", tmp_path / "off", traced=False)]
    try:
        prev = []
        for p in procs:
            prev.append(wait_line(p, "previous handler"))
            wait_line(p, "ready")
            wait_until(lambda: main_thread_blocked(p.pid))
            p.send_signal(signal.SIGTERM)
        (rc, out, err), (rc0, out0, err0) = [finish(p) for p in procs]
    finally:
        kill_all(procs)
    assert rc0 == 3
    assert rc == rc0
    # the program saw the same previous handler and printed the same lines
    assert prev[0] == prev[1] == "previous handler <Handlers.SIG_DFL: 0>"
    assert out == out0 == "got sigterm 15\n"
    assert err == err0
    # our C-level dump still ran (the signal.signal wrapper put it back on top)
    text = read(stacks_file(run_dir, "sigterm", procs[0].pid))
    assert "in wait_in_sleep" in text
    procs_, _ = records_json(run_dir)
    q = procs_[procs[0].pid]
    assert (q["state"], q["exit_code"]) == ("exited", 3)
    assert_sender(text, q)  # (on top again after the program's signal.signal)


def assert_sender(text, q):
    """The SIGTERM came from this test process: with the C extension its pid and command line
    are the stack file's first line and the record's ``signals.sigterm.sender``."""
    from hangtrace.hooks.record.recorder import _fastrec

    if _fastrec is None:
        assert not text.startswith("hangtrace: SIGTERM from")
        return
    first = text.splitlines()[0]
    assert first.startswith("hangtrace: SIGTERM from pid %d uid %d: " % (os.getpid(), os.getuid())), first
    assert "pytest" in first or "python" in first, first
    sender = q["signals"]["sigterm"]["sender"]
    assert (sender["pid"], sender["uid"]) == (os.getpid(), os.getuid()), sender


def test_sigterm_inside_a_gloo_collective(tmp_path):
    run_dir = tmp_path / "run"
    traced = start_ranks(os.path.join(SCRIPTS, "sig_gloo.py"), 2, run_dir)
    plain = start_ranks(os.path.join(SCRIPTS, "sig_gloo.py"), 2, tmp_path / "off", traced=False)
    try:
        for job in (traced, plain):
            wait_line(job[0], "waiting")
            wait_line(job[1], "entering")

        def inflight():
            for path in os.listdir(str(run_dir)):
                if path.startswith("ring-"):
                    r = R.read_ring(os.path.join(str(run_dir), path))
                    if r.header["pid"] == traced[1].pid and r.header["inflight_idx"]:
                        return True

        wait_until(inflight)
        for job in (traced, plain):
            wait_until(lambda: main_thread_blocked(job[1].pid))
            job[1].send_signal(signal.SIGTERM)
        rc = traced[1].wait(timeout=30)
        rc0 = plain[1].wait(timeout=30)
    finally:
        kill_all(traced + plain)
    assert rc0 == -signal.SIGTERM
    assert rc == rc0
    text = read(stacks_file(run_dir, "sigterm", traced[1].pid))
    assert "in blocked_in_collective" in text
    assert "distributed_c10d.py" in text and "in all_reduce" in text
    procs_, _ = records_json(run_dir)
    q = procs_[traced[1].pid]
    assert q["state"] == "killed" and q["rank"] == 1
    assert q["inflight"]["op"] == "all_reduce" and q["inflight"]["numel"] == 5
    assert "sigterm" in q["signals"]


@pytest.mark.parametrize(
    "mode,sig,expect", [("abort", signal.SIGABRT, "Aborted"), ("segv", signal.SIGSEGV, "Segmentation fault")]
)
def test_fatal_signal_writes_stacks_and_keeps_status(tmp_path, mode, sig, expect):
    run_dir = tmp_path / "run"
    procs = [start(mode, run_dir), start(mode, tmp_path / "off", traced=False)]
    try:
        (rc, out, err), (rc0, out0, err0) = [finish(p) for p in procs]
    finally:
        kill_all(procs)
    assert rc0 == -sig
    assert rc == rc0
    assert out == out0
    text = read(stacks_file(run_dir, "fatal", procs[0].pid))
    assert "Fatal Python error: " + expect in text
    assert "in crash_with_" + mode in text
    procs_, _ = records_json(run_dir)
    q = procs_[procs[0].pid]
    assert q["state"] == "killed" and "fatal" in q["signals"]


def test_exit_states_and_exceptions(tmp_path):
    run_dir = tmp_path / "run"
    modes = ["exit0", "exit7", "raise", "thread_raise"]
    procs = [start(m, run_dir) for m in modes]
    plain = [start(m, tmp_path / "off", traced=False) for m in modes]
    victim = start("sleep", run_dir)
    try:
        wait_line(victim, "ready")
        victim.send_signal(signal.SIGKILL)
        res = {m: finish(p) for m, p in zip(modes, procs)}
        res0 = {m: finish(p) for m, p in zip(modes, plain)}
        assert victim.wait(timeout=30) == -signal.SIGKILL
    finally:
        kill_all(procs + plain + [victim])
    for m in modes:
        assert res[m] == res0[m], m  # same status, stdout and stderr as untraced
    assert [res[m][0] for m in modes] == [0, 7, 1, 0]
    by_pid, errors = records_json(run_dir)
    assert errors == []
    st = {m: by_pid[p.pid] for m, p in zip(modes, procs)}
    assert (st["exit0"]["state"], st["exit0"]["exit_code"]) == ("exited", 0)
    assert (st["exit7"]["state"], st["exit7"]["exit_code"]) == ("exited", 7)
    assert (st["raise"]["state"], st["raise"]["exit_code"]) == ("exited", 1)
    assert (st["thread_raise"]["state"], st["thread_raise"]["exit_code"]) == ("exited", 0)
    assert by_pid[victim.pid]["state"] == "killed" and by_pid[victim.pid]["exit_code"] is None

    exc = [e for e in st["raise"]["events"] if e["event"] == "exception"]
    assert len(exc) == 1
    assert (exc[0]["type"], exc[0]["message"]) == ("ValueError", "bad value 42")
    assert "in fail_in_main" in exc[0]["traceback"] and "ValueError: bad value 42" in exc[0]["traceback"]
    assert [e["code"] for e in st["raise"]["events"] if e["event"] == "exit"] == [1]

    texc = [e for e in st["thread_raise"]["events"] if e["event"] == "thread_exception"]
    assert len(texc) == 1
    assert (texc[0]["type"], texc[0]["message"], texc[0]["thread_name"]) == (
        "KeyError",
        "'missing-key'",
        "worker-1",
    )
    assert "in fail_in_thread" in texc[0]["traceback"]
    assert [e["code"] for e in st["thread_raise"]["events"] if e["event"] == "exit"] == [0]


WORKER_SEGV = r"""
import ctypes, sys
from torch.utils.data import DataLoader, Dataset
class D(Dataset):
    def __len__(self):
        return 16
    def __getitem__(self, i):
        if i == 9:
            ctypes.string_at(0)  # native code reads address 0: SIGSEGV in the worker
        return i
def main():
    try:
        for _ in DataLoader(D(), batch_size=2, num_workers=1):
            pass
    except Exception:  # (RuntimeError, or EOFError/ConnectionResetError when torch meets the dead worker first)
        return "caught: DataLoader worker"
    return "no error"
out = None
while out is None:
    try:
        out = main()
    except Exception:  # (torch's SIGCHLD handler raises wherever the main thread is: traced or not)
        out = "caught: DataLoader worker"
print(out)
"""


def test_a_dataloader_workers_segfault_in_native_code_leaves_its_stack(tmp_path):
    """torch's worker signal handlers replace faulthandler's: hooks/process/workersignals.py puts ours
    back on top, so the crashed worker's stack file names its __getitem__ line; torch's own
    message and the program's behaviour (it catches the error) are unchanged (blind helpers 90, 93)."""
    script = tmp_path / "segv.py"
    script.write_text(WORKER_SEGV)
    run_dir = tmp_path / "run"
    procs = [
        subprocess.Popen(
            [sys.executable, str(script)],
            env=base_env(d, traced),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for d, traced in ((run_dir, True), (tmp_path / "off", False))
    ]
    (rc, out, err), (rc0, out0, err0) = [finish(p, timeout=120) for p in procs]
    assert rc == rc0 == 0 and out == out0 == "caught: DataLoader worker\n", (rc, rc0, out, out0, err[-2000:])
    assert "ERROR: Unexpected segmentation fault encountered in worker." in err and err0.count(
        "ERROR"
    ) == err.count("ERROR")
    fatal = [
        f
        for f in os.listdir(run_dir / "stacks")
        if f.startswith("fatal-") and os.path.getsize(run_dir / "stacks" / f) > 0
    ]
    assert len(fatal) == 1, os.listdir(run_dir / "stacks")
    text = read(run_dir / "stacks" / fatal[0])
    assert "Segmentation fault" in text and "in __getitem__" in text and "segv.py" in text, text[-1500:]
