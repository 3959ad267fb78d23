"""Unit tests of tracer.stacks parsing and helpers (no ptrace needed)."""

import json
import os
import subprocess
import sys
import textwrap

from hangtrace.tracer.collect import stacks
from hangtrace.tracer.stackmodel import faulthandler_text
from hangtrace.tracer.stackmodel import threads as stackthreads

# A trimmed sample of `py-spy dump --pid P --json` (py-spy 0.4.3, Python 3.11), captured from
# a process whose main thread waits in queue.Queue.get and a thread in time.sleep; the
# second thread of the sample was taken with --native (frames with "module" set, line 0).
PYSPY_SAMPLE = r"""
[
  {"pid": 3599, "thread_id": 140084042598080, "thread_name": "sleeper", "os_thread_id": 3641,
   "active": false, "owns_gil": false,
   "frames": [
     {"name": "clock_nanosleep", "filename": "/usr/lib/x86_64-linux-gnu/libc.so.6",
      "module": "/usr/lib/x86_64-linux-gnu/libc.so.6", "short_filename": "libc.so.6", "line": 0,
      "locals": null, "is_entry": true, "is_shim_entry": true},
     {"name": "w", "filename": "<string>", "module": null, "short_filename": "<string>",
      "line": 3, "locals": null, "is_entry": true, "is_shim_entry": false},
     {"name": "Thread.run", "filename": "/usr/lib/python3.11/threading.py", "module": null,
      "short_filename": "threading.py", "line": 982, "locals": null, "is_entry": false,
      "is_shim_entry": false},
     {"name": "Thread._bootstrap", "filename": "/usr/lib/python3.11/threading.py",
      "module": null, "short_filename": "threading.py", "line": 1002, "locals": null,
      "is_entry": true, "is_shim_entry": true}],
   "process_info": null},
  {"pid": 3599, "thread_id": 140084057553792, "thread_name": "MainThread",
   "os_thread_id": 3599, "active": false, "owns_gil": false,
   "frames": [
     {"name": "Condition.wait", "filename": "/usr/lib/python3.11/threading.py", "module": null,
      "short_filename": "threading.py", "line": 327, "locals": null, "is_entry": false,
      "is_shim_entry": false},
     {"name": "Queue.get", "filename": "/usr/lib/python3.11/queue.py", "module": null,
      "short_filename": "queue.py", "line": 171, "locals": null, "is_entry": false,
      "is_shim_entry": false},
     {"name": "<module>", "filename": "<string>", "module": null, "short_filename": "<string>",
      "line": 6, "locals": null, "is_entry": true, "is_shim_entry": true}],
   "process_info": null}
]
"""


def test_normalize_pyspy_sample():
    threads = stackthreads.normalize_pyspy(PYSPY_SAMPLE)
    assert [t["thread_name"] for t in threads] == ["sleeper", "MainThread"]
    main = threads[1]
    assert main["thread_id"] == 140084057553792 and main["os_thread_id"] == 3599
    assert main["active"] is False and main["owns_gil"] is False
    assert main["frames"][1] == {
        "name": "Queue.get",
        "filename": "/usr/lib/python3.11/queue.py",
        "line": 171,
        "native": False,
    }
    assert threads[0]["frames"][0]["native"] is True and threads[0]["frames"][0]["line"] == 0
    assert stackthreads.top_frames(threads, n=2) == [
        "Condition.wait (threading.py:327)",
        "Queue.get (queue.py:171)",
    ]
    # parsed list accepted too; garbage refused
    assert stackthreads.normalize_pyspy(json.loads(PYSPY_SAMPLE)) == threads
    for bad in ('{"a": 1}', "[1, 2]"):
        try:
            stackthreads.normalize_pyspy(bad)
        except ValueError:
            pass
        else:
            raise AssertionError("accepted %r" % bad)


CHILD = textwrap.dedent(r"""
    import faulthandler, sys, threading, time
    out = open(sys.argv[1], "w")
    started = threading.Event()
    def sleeper_fn():
        started.set()
        time.sleep(60)
    threading.Thread(target=sleeper_fn, daemon=True).start()
    started.wait()
    def inner():
        faulthandler.dump_traceback(out, all_threads=True)   # dump 1
    def outer():
        inner()
    outer()
    faulthandler.dump_traceback(out, all_threads=False)      # dump 2 (one "Stack")
    out.write("some marker line\n"); out.flush()
    def deep(n):
        if n:
            return deep(n - 1)
        faulthandler.dump_traceback(out, all_threads=True)   # dump 3 (truncated at 100)
    deep(150)
    out.flush()
""")


def _make_dumps(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    dump = tmp_path / "dump.txt"
    subprocess.run([sys.executable, str(script), str(dump)], check=True, timeout=30)
    return script, dump.read_text()


def test_parse_faulthandler_real_output(tmp_path):
    script, text = _make_dumps(tmp_path)
    dumps = faulthandler_text.parse_faulthandler_dumps(text)
    assert len(dumps) == 3, text
    d1 = dumps[0]["threads"]
    assert len(d1) == 2
    main = stackthreads.main_thread(d1)
    assert main["thread_name"] == "MainThread" and main["current"] is True
    assert [f["name"] for f in main["frames"]] == ["inner", "outer", "<module>"]
    assert main["frames"][0]["filename"] == str(script)
    assert main["frames"][0]["line"] == 11  # 1-based line of the dump_traceback call in CHILD
    other = [t for t in d1 if t is not main][0]
    assert other["current"] is False and other["thread_name"] is None
    assert other["frames"][0]["name"] == "sleeper_fn"
    assert other["frames"][-1]["name"] == "_bootstrap"
    assert isinstance(other["thread_id"], int) and other["thread_id"] != main["thread_id"]
    assert other["active"] is None and other["owns_gil"] is None
    # dump 2: all_threads=False prints "Stack (most recent call first):"
    assert len(dumps[1]["threads"]) == 1
    assert dumps[1]["threads"][0]["frames"][0]["name"] == "<module>"
    # dump 3: after an unrelated line, 100 frames and "..."
    assert dumps[2]["truncated"] is True
    last = faulthandler_text.parse_faulthandler_text(text)
    assert last == dumps[2]["threads"]
    assert len(stackthreads.main_thread(last)["frames"]) == 100
    assert stackthreads.top_frames(last, n=2) == ["deep (child.py:20)", "deep (child.py:19)"]


def test_parse_faulthandler_fatal_and_edge_cases():
    text = (
        "Fatal Python error: Segmentation fault\n\n"
        "Thread 0x00007f10a8cf06c0 (most recent call first):\n"
        "  Garbage-collecting\n"
        '  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap\n\n'
        "Current thread 0x00007f10a9a7fb80 (most recent call first):\n"
        '  File "/x/ctypes/__init__.py", line 519 in string_at\n'
        '  File "<string>", line 5 in <module>\n\n'
        "Extension modules: numpy.core._multiarray_umath (total: 1)\n"
        "Thread 0x00007f10a8cf06c0 [worker] (most recent call first):\n"
        "  <no Python frame>\n\n"
        "Current thread 0x00007f10a9a7fb80 (most recent call first):\n"
        '  File "???", line ??? in ???\n'
    )
    dumps = faulthandler_text.parse_faulthandler_dumps(text)
    assert len(dumps) == 2
    assert dumps[0]["header"] == "Fatal Python error: Segmentation fault"
    cur = [t for t in dumps[0]["threads"] if t["current"]][0]
    assert cur["thread_id"] == 0x00007F10A9A7FB80
    assert stackthreads.frame_str(cur["frames"][0]) == "string_at (__init__.py:519)"
    assert len(dumps[0]["threads"]) == 2 and dumps[0]["threads"][0]["frames"][0]["line"] == 1002
    assert dumps[1]["header"] is None
    assert dumps[1]["threads"][0]["thread_name"] == "worker"
    assert dumps[1]["threads"][0]["frames"] == []
    assert dumps[1]["threads"][1]["frames"][0]["line"] == 0
    # two appended dumps with no marker in between: split on the missing blank line
    one = (
        'Thread 0x1 (most recent call first):\n  File "a.py", line 1 in f\n\n'
        'Current thread 0x2 (most recent call first):\n  File "a.py", line 2 in <module>\n'
    )
    assert len(faulthandler_text.parse_faulthandler_dumps(one + one)) == 2
    assert faulthandler_text.parse_faulthandler_text("") == []
    assert faulthandler_text.parse_faulthandler_text(b"garbage\n") == []


def test_frame_helpers():
    f = {"name": "Queue.get", "filename": "/usr/lib/python3.11/queue.py", "line": 171}
    assert stackthreads.frame_str(f) == "Queue.get (queue.py:171)"
    assert stackthreads.frame_str(f, full_path=True) == "Queue.get (/usr/lib/python3.11/queue.py:171)"
    assert (
        stackthreads.frame_str({"name": "nanosleep", "filename": "/l/libc.so.6", "line": 0})
        == "nanosleep (libc.so.6)"
    )
    g = {"name": "get", "filename": "/other/prefix/queue.py", "line": 171}
    assert stackthreads.frame_key(f) == stackthreads.frame_key(g)
    assert stackthreads.top_frames([]) == [] and stackthreads.main_thread([]) is None


def test_ptrace_problem_remedy(monkeypatch):
    monkeypatch.setattr(stacks, "_cap_eff", lambda *a: 0)
    monkeypatch.setattr(stacks, "_yama_scope", lambda: 1)
    text = stacks.ptrace_problem()
    for needle in ("CAP_SYS_PTRACE", "sysctl kernel.yama.ptrace_scope=0", "docker run --cap-add SYS_PTRACE"):
        assert needle in text
    monkeypatch.setattr(stacks, "_cap_eff", lambda *a: 1 << stacks.CAP_SYS_PTRACE)
    assert stacks.ptrace_problem() is None
    monkeypatch.setattr(stacks, "_yama_scope", lambda: 3)
    assert "ptrace_scope=3" in stacks.ptrace_problem()
    monkeypatch.setattr(stacks, "_yama_scope", lambda: None)
    assert stacks.ptrace_problem() is None


def test_pyspy_error_gist():
    err = (
        "Error: Failed to get process executable name. Check that the process is running.\n\n"
        "Caused by:\n    0: Permission denied (os error 13)\n    1: Permission denied\n\n"
        "Stack backtrace:\n   0: <E as anyhow::context::ext::StdError>::ext_context\n"
    )
    assert stacks._first_error_line(err) == (
        "Error: Failed to get process executable name. Check that the process is running. "
        "(Permission denied (os error 13))"
    )


def test_missing_pyspy_reported(tmp_path):
    res = stacks.dump_stacks([os.getpid()], pyspy=str(tmp_path / "no-such-py-spy"))
    assert res[os.getpid()]["error"] == "py-spy missing: pip install py-spy"
    assert res[os.getpid()]["threads"] is None
