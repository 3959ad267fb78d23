"""Python stacks of live processes, taken from outside: py-spy first, faulthandler as fallback.

Thread format (the one ``model.ProcessInfo.stacks`` holds), for every source::

    {'thread_name': str | None,   # 'MainThread', ...; None when the source does not say
     'thread_id': int | None,     # pthread id (py-spy's thread_id == faulthandler's 0x... id)
     'os_thread_id': int | None,  # Linux TID (py-spy only)
     'active': bool | None,       # py-spy: thread was running (not idle); faulthandler: None
     'owns_gil': bool | None,     # py-spy: thread held the GIL; faulthandler: None
     'current': bool,             # faulthandler: the thread that ran the dump ("Current
                                  #   thread"; for a fatal error, the crashing thread)
     'frames': [{'name': str, 'filename': str, 'line': int, 'native': bool}, ...]}

Frames are **innermost first** (py-spy's order; faulthandler prints "most recent call
first" too). ``line`` is 0 when unknown (native frames, faulthandler's ``???``).
Function names are what the source prints: py-spy shows ``co_qualname`` on Python >= 3.11
(``Queue.get``), faulthandler ``co_name`` (``get``); ``frame_key`` compares both.

Nothing here imports torch or ray. Helper subprocesses (py-spy) run with
``config.helper_env()`` so that a ``HANGTRACE=1`` environment never traces them.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from concurrent.futures import ThreadPoolExecutor

from hangtrace.tracer import config

#: Linux capability number of CAP_SYS_PTRACE (linux/capability.h).
CAP_SYS_PTRACE = 19

YAMA_PTRACE_SCOPE = "/proc/sys/kernel/yama/ptrace_scope"

PTRACE_REMEDY = (
    "reading another process's memory needs ptrace permission: run hangtrace as root or "
    "with CAP_SYS_PTRACE (containers: `docker run --cap-add SYS_PTRACE ...`, Kubernetes: "
    "securityContext.capabilities.add: [\"SYS_PTRACE\"]), or relax the Yama LSM on the host "
    "with `sysctl kernel.yama.ptrace_scope=0`; without it hangtrace falls back to "
    "faulthandler dumps of processes that registered one (HANGTRACE=1 does)"
)

PYSPY_MISSING = "py-spy missing: pip install py-spy"


# --------------------------------------------------------------------------- py-spy

def pyspy_path():
    """Path of the py-spy executable, or None.

    Looks first in this interpreter's scripts directory (where ``pip install py-spy`` puts
    it, also when that directory is not on PATH), then on PATH.
    """
    cands = []
    try:
        cands.append(os.path.join(sysconfig.get_path("scripts"), "py-spy"))
    except Exception:
        pass
    cands.append(os.path.join(os.path.dirname(sys.executable), "py-spy"))
    for c in cands:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return shutil.which("py-spy")


def pyspy_available(timeout_s=5.0):
    """``(True, 'py-spy 0.4.3 at /path')`` or ``(False, reason)``.

    Runs ``py-spy --version`` (a few ms). Reasons: ``"py-spy missing: pip install py-spy"``,
    or the error of the version call. It does not check ptrace permission: see
    :func:`ptrace_problem`.
    """
    path = pyspy_path()
    if not path:
        return False, PYSPY_MISSING
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True,
                             timeout=timeout_s, env=config.helper_env())
    except FileNotFoundError:
        return False, PYSPY_MISSING
    except (OSError, subprocess.SubprocessError) as e:
        return False, "py-spy at %s does not run: %s" % (path, e)
    if out.returncode != 0:
        return False, "py-spy at %s does not run: %s" % (path, _first_error_line(out.stderr))
    return True, "%s at %s" % (out.stdout.strip() or "py-spy", path)


def _cap_eff(status_path="/proc/self/status"):
    try:
        with open(status_path) as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _yama_scope():
    try:
        with open(YAMA_PTRACE_SCOPE) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None  # no Yama LSM: classic ptrace rules (same uid, or CAP_SYS_PTRACE)


def _is_descendant(pid):
    try:
        import psutil
        me = os.getpid()
        return any(p.pid == me for p in psutil.Process(pid).parents())
    except Exception:
        return False


def _proc_uids(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("Uid:"):
                    return [int(x) for x in line.split()[1:]]
    except (OSError, ValueError):
        pass
    return None


def ptrace_problem(pid=None):
    """Why py-spy cannot read other processes from here, with the remedy; None if it can.

    Checks (Linux): the Yama LSM's ``/proc/sys/kernel/yama/ptrace_scope`` (0 classic,
    1 descendants only, 2 CAP_SYS_PTRACE only, 3 nobody — see the kernel's
    Documentation/admin-guide/LSM/Yama.rst), bit 19 (CAP_SYS_PTRACE) of ``CapEff`` in
    ``/proc/self/status``, and, with ``pid``, whether the target runs under another uid
    (classic ptrace rule: same uid or CAP_SYS_PTRACE). The answer is a prediction: a
    seccomp profile or another LSM can still refuse, which :func:`dump_stacks` reports as
    "permission denied" with the same remedy.
    """
    scope = _yama_scope()
    caps = _cap_eff()
    has_cap = caps is not None and bool(caps & (1 << CAP_SYS_PTRACE))
    if scope is not None and scope >= 3:
        return ("ptrace is disabled on this host (kernel.yama.ptrace_scope=3 cannot be lowered "
                "without a reboot); py-spy cannot read any process. Reboot with "
                "`sysctl kernel.yama.ptrace_scope=0` in /etc/sysctl.d, or rely on faulthandler "
                "dumps. " + PTRACE_REMEDY)
    if has_cap:
        return None
    if scope == 2:
        return "kernel.yama.ptrace_scope=2 allows only CAP_SYS_PTRACE, which this process lacks; " \
               + PTRACE_REMEDY
    if scope == 1 and not (pid is not None and _is_descendant(pid)):
        return ("kernel.yama.ptrace_scope=1 allows tracing only of this process's own "
                "descendants without CAP_SYS_PTRACE, which this process lacks; " + PTRACE_REMEDY)
    if pid is not None:
        # without CAP_SYS_PTRACE the target's real, effective and saved uids must all be
        # ours (kernel/ptrace.c: __ptrace_may_access) -- also when we are uid 0
        uids = _proc_uids(pid)
        if uids and any(u != os.getuid() for u in uids[:3]):
            return ("pid %d runs as uid %d, this process as uid %d without CAP_SYS_PTRACE; "
                    % (pid, uids[0], os.getuid()) + PTRACE_REMEDY)
    return None


def _first_error_line(stderr):
    """py-spy prints 'Error: ...' then 'Caused by:' lines and a Rust backtrace; keep the gist."""
    lines = [l.strip() for l in (stderr or "").splitlines() if l.strip()]
    if not lines:
        return "no error text"
    out = lines[0]
    if "Caused by:" in lines:
        i = lines.index("Caused by:")
        if i + 1 < len(lines):
            out += " (" + re.sub(r"^\d+:\s*", "", lines[i + 1]) + ")"
    return out[:300]


def _pid_state(pid):
    """'alive' | 'gone' | 'zombie'."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return "gone"
    except OSError:
        return "alive"
    # state is the field after the ')' closing comm (comm may contain spaces and ')')
    state = data[data.rfind(")") + 2:data.rfind(")") + 3]
    return "zombie" if state in ("Z", "X", "x") else "alive"


def normalize_pyspy(data):
    """py-spy ``dump --json`` output (a list of thread dicts) -> the thread format above.

    py-spy 0.4.3 prints, per thread: ``pid, thread_id, thread_name, os_thread_id, active,
    owns_gil, frames[{name, filename, module, short_filename, line, locals, is_entry,
    is_shim_entry}], process_info`` (checked against a live process; ``module`` is set
    only on native frames, which ``--native`` adds with ``line`` 0). Accepts the JSON text
    or the parsed list. Raises ValueError on anything that is not such a list.
    """
    if isinstance(data, (str, bytes)):
        data = json.loads(data)
    if not isinstance(data, list):
        raise ValueError("py-spy JSON: expected a list of threads, got %s" % type(data).__name__)
    threads = []
    for t in data:
        if not isinstance(t, dict):
            raise ValueError("py-spy JSON: thread entry is %s" % type(t).__name__)
        frames = []
        for fr in t.get("frames") or []:
            frames.append({
                "name": str(fr.get("name") or "?"),
                "filename": str(fr.get("filename") or fr.get("short_filename") or "?"),
                "line": int(fr.get("line") or 0),
                "native": fr.get("module") is not None,
            })
        threads.append({
            "thread_name": t.get("thread_name"),
            "thread_id": t.get("thread_id"),
            "os_thread_id": t.get("os_thread_id"),
            "active": t.get("active"),
            "owns_gil": t.get("owns_gil"),
            "current": False,
            "frames": frames,
        })
    return threads


def _result(pid, threads=None, error=None, remedy=None, t0=None, **extra):
    r = {"pid": pid, "threads": threads, "source": "py-spy" if threads is not None else None,
         "error": error, "remedy": remedy,
         "duration_s": (time.monotonic() - t0) if t0 is not None else 0.0}
    r.update(extra)
    return r


def _vanished(pid, state):
    if state == "zombie":
        return "process vanished: pid %d has exited (zombie, not yet reaped by its parent)" % pid
    return "process vanished: pid %d no longer exists" % pid


def dump_one(pid, native=False, timeout_s=10.0, pyspy=None):
    """One py-spy dump; see :func:`dump_stacks` for the result shape."""
    t0 = time.monotonic()
    pid = int(pid)
    state = _pid_state(pid)
    if state != "alive":
        return _result(pid, error=_vanished(pid, state), t0=t0)
    exe = pyspy or pyspy_path()
    if not exe:
        return _result(pid, error=PYSPY_MISSING, remedy="pip install py-spy", t0=t0)
    base = [exe, "dump", "--pid", str(pid), "--json"] + (["--native"] if native else [])
    nonblocking = False
    try:
        try:
            out = subprocess.run(base, capture_output=True, text=True, timeout=timeout_s,
                                 env=config.helper_env())
        except subprocess.TimeoutExpired:
            # A process in uninterruptible sleep (D state, e.g. stuck NFS IO) never reaches
            # the ptrace stop py-spy waits for; reading without pausing it still works.
            if _pid_state(pid) != "alive":
                return _result(pid, error=_vanished(pid, _pid_state(pid)), t0=t0)
            nonblocking = True
            try:
                out = subprocess.run(base + ["--nonblocking"], capture_output=True, text=True,
                                     timeout=max(1.0, min(timeout_s, 5.0)),
                                     env=config.helper_env())
            except subprocess.TimeoutExpired:
                return _result(pid, error="py-spy timed out after %.1f s (also with "
                                          "--nonblocking)" % timeout_s, t0=t0)
    except FileNotFoundError:
        return _result(pid, error=PYSPY_MISSING, remedy="pip install py-spy", t0=t0)
    except OSError as e:
        return _result(pid, error="py-spy could not start: %s" % e, t0=t0)
    if out.returncode != 0:
        state = _pid_state(pid)
        if state != "alive":
            return _result(pid, error=_vanished(pid, state), t0=t0)
        err = _first_error_line(out.stderr)
        low = (out.stderr or "").lower()
        if "permission denied" in low or "operation not permitted" in low:
            remedy = ptrace_problem(pid) or PTRACE_REMEDY
            return _result(pid, error="permission denied reading pid %d: %s. %s"
                           % (pid, err, remedy), remedy=remedy, t0=t0)
        if "failed to find python version" in low or "failed to find python interpreter" in low:
            return _result(pid, error="pid %d does not look like a Python process to py-spy "
                                      "(%s)" % (pid, err), t0=t0)
        return _result(pid, error="py-spy failed on pid %d (exit %d): %s"
                       % (pid, out.returncode, err), t0=t0)
    try:
        threads = normalize_pyspy(out.stdout)
    except (ValueError, TypeError, AttributeError) as e:
        return _result(pid, error="py-spy output unreadable: %s: %r" % (e, out.stdout[:200]),
                       t0=t0)
    return _result(pid, threads=threads, t0=t0, nonblocking=nonblocking)


def dump_stacks(pids, native=False, timeout_s=10.0, max_workers=8, pyspy=None):
    """Take py-spy stacks of many local processes in parallel.

    ``pids``: iterable of ints (duplicates are taken once). ``native``: add C/C++ frames
    (``--native``; ~0.65 s per torch process here against ~20 ms without). ``timeout_s``:
    per process, seconds; a dump that times out is retried once with ``--nonblocking``
    (which does not wait for the process to stop). ``max_workers``: py-spy subprocesses
    running at once, so the whole call takes about ``ceil(len(pids)/max_workers)`` times
    one dump.

    Returns ``{pid: StackResult}``; a StackResult is a dict::

        {'pid': int, 'threads': [thread, ...] | None, 'source': 'py-spy' | None,
         'error': str | None, 'remedy': str | None, 'duration_s': float,
         'nonblocking': bool}   # 'nonblocking' only on success

    Exactly one of ``threads`` / ``error`` is set. Error texts: ``"process vanished: ..."``
    (pid gone or zombie, checked before and after the dump), ``"py-spy missing: pip install
    py-spy"``, ``"permission denied reading pid N: ... <remedy>"`` (remedy from
    :func:`ptrace_problem`, naming CAP_SYS_PTRACE, ``sysctl kernel.yama.ptrace_scope=0`` and
    ``docker run --cap-add SYS_PTRACE``), ``"... does not look like a Python process"``,
    ``"py-spy timed out ..."``, or py-spy's own first error line. Never raises for a
    per-process failure. Every py-spy runs with ``config.helper_env()``.
    """
    uniq = []
    for p in pids:
        p = int(p)
        if p not in uniq:
            uniq.append(p)
    if not uniq:
        return {}
    exe = pyspy or pyspy_path()
    if len(uniq) == 1 or max_workers <= 1:
        return {p: dump_one(p, native, timeout_s, exe) for p in uniq}
    with ThreadPoolExecutor(max_workers=min(max_workers, len(uniq)),
                            thread_name_prefix="hangtrace-pyspy") as pool:
        futs = {p: pool.submit(dump_one, p, native, timeout_s, exe) for p in uniq}
        return {p: f.result() for p, f in futs.items()}


# --------------------------------------------------------------------------- faulthandler

# Formats, from CPython's Python/traceback.c (3.8 .. 3.13):
#   "Thread 0x00007f...  (most recent call first):"  / "Current thread 0x... (...):"
#   "Stack (most recent call first):"  (all_threads=False)
#   '  File "x.py", line 3 in f'   '  File "???", line ??? in ???'   "  ..." (depth > 100)
#   "  <no Python frame>"
# Newer versions may add a thread name: 'Thread 0x... [name] (most recent call first):'.
# Threads of one dump are separated by a blank line; consecutive dumps are not.
_THREAD_RE = re.compile(
    r"^(?P<cur>Current thread|Thread) (?P<tid>0x[0-9a-fA-F]+)(?: \[(?P<name>[^\]]*)\])?"
    r" \(most recent call first\):\s*$")
_STACK_RE = re.compile(r"^Stack \(most recent call first\):\s*$")
_FRAME_RE = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+|\?+) in (?P<name>.*?)\s*$')
_FATAL_RE = re.compile(r"^Fatal Python error: (?P<msg>.*)$")


def _is_threading_bootstrap(frame):
    return (frame["name"] in ("_bootstrap", "Thread._bootstrap")
            and os.path.basename(frame["filename"]) == "threading.py")


def _mark_main(threads):
    """faulthandler does not name threads: call the one not started by threading 'MainThread'.

    Inferred: the main thread's outermost frame is the script's ``<module>`` (or runpy),
    while every ``threading.Thread`` starts in ``threading.py: _bootstrap``. CPython lists
    threads newest first, so among several candidates the last one is the oldest.
    """
    if any(t.get("thread_name") for t in threads):
        return
    cands = [t for t in threads if t["frames"] and not _is_threading_bootstrap(t["frames"][-1])]
    if not cands:
        return
    mod = [t for t in cands if t["frames"][-1]["name"] == "<module>"]
    (mod or cands)[-1]["thread_name"] = "MainThread"


def parse_faulthandler_dumps(text):
    """All dumps in a faulthandler file, oldest first.

    ``text``: what ``faulthandler.dump_traceback`` / ``register`` / ``enable`` wrote (one
    file may hold several appended dumps). Returns ``[{'header': str | None, 'threads':
    [thread, ...], 'truncated': bool}]``; ``header`` is e.g. ``"Fatal Python error:
    Segmentation fault"``; ``truncated`` when a thread had more than 100 frames
    (faulthandler prints ``...``). A new dump starts at a header line, at a thread line not
    preceded by a blank line, after unknown unindented text (e.g. "Extension modules: ..."),
    or when a thread id repeats. Unknown indented lines inside a thread are ignored.
    Threads carry ``thread_id`` (int), ``current`` (the "Current thread"), ``thread_name``
    (``'MainThread'`` inferred, see ``_mark_main``, or the ``[name]`` newer Pythons print),
    ``active``/``owns_gil`` None.
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    dumps = []
    cur = None             # current dump
    thread = None          # current thread (frames go there)
    prev_blank = True      # the previous line was blank
    saw_other = False      # unknown text since the last thread line
    pending_header = None  # "Fatal Python error: ..." waiting for its first thread

    for raw in text.splitlines():
        line = raw.rstrip("\r")
        m = _THREAD_RE.match(line)
        stack_line = m is None and _STACK_RE.match(line) is not None
        if m or stack_line:
            tid = int(m.group("tid"), 16) if m else None
            if (cur is None or stack_line or pending_header is not None or saw_other
                    or not prev_blank
                    or (tid is not None and any(t["thread_id"] == tid for t in cur["threads"]))):
                cur = {"header": pending_header, "threads": [], "truncated": False}
                dumps.append(cur)
                pending_header = None
            thread = {"thread_name": (m.group("name") if m else None) or None,
                      "thread_id": tid, "os_thread_id": None, "active": None,
                      "owns_gil": None, "current": stack_line or m.group("cur") != "Thread",
                      "frames": []}
            cur["threads"].append(thread)
            prev_blank = saw_other = False
            continue
        stripped = line.strip()
        if not stripped:
            prev_blank = True
            continue
        prev_blank = False
        fm = _FRAME_RE.match(line)
        if fm and thread is not None:
            ln = fm.group("line")
            thread["frames"].append({"name": fm.group("name"), "filename": fm.group("file"),
                                     "line": int(ln) if ln.isdigit() else 0, "native": False})
        elif stripped == "..." and thread is not None:
            cur["truncated"] = True
        elif stripped == "<no Python frame>" and thread is not None:
            pass
        elif line[:1].isspace() and thread is not None:
            pass   # other indented detail inside a thread (e.g. "  Garbage-collecting")
        elif _FATAL_RE.match(stripped):
            pending_header = stripped
            thread = None
        else:
            # other text ("Extension modules: ...", a marker line): the dump is over
            thread = None
            saw_other = True
    for d in dumps:
        _mark_main(d["threads"])
    return [d for d in dumps if d["threads"]]


def parse_faulthandler_text(text):
    """Threads of the **last** dump in ``text`` (thread format above); [] when there is none.

    See :func:`parse_faulthandler_dumps` for every dump in the file.
    """
    dumps = parse_faulthandler_dumps(text)
    return dumps[-1]["threads"] if dumps else []


def signal_caught(pid, signum):
    """True when ``pid`` has a handler installed for ``signum`` (``SigCgt`` in
    ``/proc/PID/status``, a hex mask with bit ``signum - 1``; proc(5)). False when the
    signal is default/ignored or the process is unreadable."""
    try:
        with open("/proc/%d/status" % int(pid)) as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) & (1 << (int(signum) - 1)))
    except (OSError, ValueError, IndexError):
        pass
    return False


def _size(path):
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def request_faulthandler_dump(pid, signum, dump_file, timeout_s=3.0, *, registered=True):
    """Make ``pid`` write its stacks with faulthandler and return them (thread list) or None.

    Calling this is the caller's statement (from the ring header or run directory) that
    the process ran ``faulthandler.register(signum, file=dump_file, all_threads=True)``;
    pass ``registered=False`` when that is not known, and nothing is sent. As a second,
    independent guard the handler must show in ``SigCgt`` of ``/proc/PID/status``;
    otherwise no signal is sent — SIGUSR1/SIGUSR2 left at SIG_DFL terminate the process (in Ray
    workers SIGUSR1 is SIG_DFL). faulthandler's C handler dumps even while the main thread
    waits inside a C call (a gloo collective), unlike a Python ``signal.signal`` handler.

    Sends ``signum``, waits up to ``timeout_s`` seconds for ``dump_file`` to grow and stop
    growing (polls every 10 ms), and parses what was appended. Returns None when not
    registered, the pid is gone, the signal cannot be sent (EPERM), or nothing arrived in
    time.
    """
    if not registered or not signal_caught(pid, signum):
        return None
    start = _size(dump_file)
    try:
        os.kill(int(pid), int(signum))
    except (ProcessLookupError, PermissionError):
        return None
    deadline = time.monotonic() + timeout_s
    last, stable_since = start, None
    while time.monotonic() < deadline:
        time.sleep(0.01)
        size = _size(dump_file)
        if size < start:       # file was truncated/rewritten: read from the beginning
            start = 0
        if size > start:
            if size != last:
                last, stable_since = size, time.monotonic()
            elif time.monotonic() - stable_since >= 0.05:
                break
        elif _pid_state(int(pid)) != "alive":
            return None
    if last <= start:
        return None
    try:
        with open(dump_file, "rb") as f:
            f.seek(start)
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    threads = parse_faulthandler_text(text)
    return threads or None


# --------------------------------------------------------------------------- helpers

def frame_str(frame, full_path=False):
    """``'func (file.py:line)'``; the base name of the file unless ``full_path``."""
    fn = frame.get("filename") or "?"
    if not full_path:
        fn = os.path.basename(fn) or fn
    line = frame.get("line") or 0
    return "%s (%s:%d)" % (frame.get("name") or "?", fn, line) if line else \
        "%s (%s)" % (frame.get("name") or "?", fn)


def frame_key(frame):
    """Source-independent identity of a frame: ``(basename, line, short name)``, where the
    short name drops py-spy's class prefix (``Queue.get`` -> ``get``) so py-spy and
    faulthandler frames compare equal."""
    name = (frame.get("name") or "?").rsplit(".", 1)[-1]
    return (os.path.basename(frame.get("filename") or "?"), frame.get("line") or 0, name)


def main_thread(threads):
    """The main thread of a thread list: named 'MainThread', else the one not started by
    ``threading`` (outermost frame not ``threading._bootstrap``), else the first; None if
    empty."""
    if not threads:
        return None
    for t in threads:
        if t.get("thread_name") == "MainThread":
            return t
    for t in threads:
        fr = t.get("frames") or []
        if fr and not _is_threading_bootstrap(fr[-1]):
            return t
    return threads[0]


def top_frames(threads, n=8, python_only=True):
    """Up to ``n`` innermost frames of the main thread as :func:`frame_str` strings
    (innermost first). Native frames are skipped unless ``python_only`` is False."""
    t = main_thread(threads or [])
    if t is None:
        return []
    frames = [f for f in t.get("frames") or [] if not (python_only and f.get("native"))]
    return [frame_str(f) for f in frames[:n]]
