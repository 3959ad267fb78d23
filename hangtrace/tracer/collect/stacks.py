"""Python stacks of live processes, taken from outside with py-spy.

In: pids of local processes. Out: per pid a StackResult (:func:`dump_stacks`): its threads
in the thread format of ``stackmodel/threads.py`` (py-spy's JSON normalised there, the
kernel's word on blocked threads from ``collect/kernelwait.py``, source lines from
``collect/sourcelines.py``), or an error with its remedy (:func:`ptrace_problem`).
faulthandler dumps on request (the fallback) are ``collect/faulthandler.py``'s.

Nothing here imports torch or ray. Helper subprocesses (py-spy) run with
``config.helper_env()`` so that a ``HANGTRACE=1`` environment never traces them.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, Iterable, List, Optional, Tuple

from hangtrace.tracer import config
from hangtrace.tracer.collect import kernelwait, sourcelines
from hangtrace.tracer.stackmodel.threads import Thread, normalize_pyspy

StackResult = Dict[str, Any]  # one process's dump (see ``dump_stacks``)

#: Linux capability number of CAP_SYS_PTRACE (linux/capability.h).
CAP_SYS_PTRACE = 19

YAMA_PTRACE_SCOPE = "/proc/sys/kernel/yama/ptrace_scope"

PTRACE_REMEDY = (
    "reading another process's memory needs ptrace permission: run hangtrace as root or "
    "with CAP_SYS_PTRACE (containers: `docker run --cap-add SYS_PTRACE ...`, Kubernetes: "
    'securityContext.capabilities.add: ["SYS_PTRACE"]), or relax the Yama LSM on the host '
    "with `sysctl kernel.yama.ptrace_scope=0`; without it hangtrace falls back to "
    "faulthandler dumps of processes that registered one (HANGTRACE=1 does)"
)

PYSPY_MISSING = "py-spy missing: pip install py-spy"


# --------------------------------------------------------------------------- py-spy


def pyspy_path() -> Optional[str]:
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


def pyspy_available(timeout_s: float = 5.0) -> Tuple[bool, str]:
    """``(True, 'py-spy 0.4.3 at /path')`` or ``(False, reason)``.

    Runs ``py-spy --version`` (a few ms). Reasons: ``"py-spy missing: pip install py-spy"``,
    or the error of the version call. It does not check ptrace permission: see
    :func:`ptrace_problem`.
    """
    path = pyspy_path()
    if not path:
        return False, PYSPY_MISSING
    try:
        out = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=timeout_s, env=config.helper_env()
        )
    except FileNotFoundError:
        return False, PYSPY_MISSING
    except (OSError, subprocess.SubprocessError) as e:
        return False, "py-spy at %s does not run: %s" % (path, e)
    if out.returncode != 0:
        return False, "py-spy at %s does not run: %s" % (path, _first_error_line(out.stderr))
    return True, "%s at %s" % (out.stdout.strip() or "py-spy", path)


def _cap_eff(status_path: str = "/proc/self/status") -> Optional[int]:
    try:
        with open(status_path) as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _yama_scope() -> Optional[int]:
    try:
        with open(YAMA_PTRACE_SCOPE) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None  # no Yama LSM: classic ptrace rules (same uid, or CAP_SYS_PTRACE)


def _is_descendant(pid: int) -> bool:
    try:
        import psutil

        me = os.getpid()
        return any(p.pid == me for p in psutil.Process(pid).parents())
    except Exception:
        return False


def _proc_uids(pid: int) -> Optional[List[int]]:
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("Uid:"):
                    return [int(x) for x in line.split()[1:]]
    except (OSError, ValueError):
        pass
    return None


def ptrace_problem(pid: Optional[int] = None) -> Optional[str]:
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
        return (
            "ptrace is disabled on this host (kernel.yama.ptrace_scope=3 cannot be lowered "
            "without a reboot); py-spy cannot read any process. Reboot with "
            "`sysctl kernel.yama.ptrace_scope=0` in /etc/sysctl.d, or rely on faulthandler "
            "dumps. " + PTRACE_REMEDY
        )
    if has_cap:
        return None
    if scope == 2:
        return (
            "kernel.yama.ptrace_scope=2 allows only CAP_SYS_PTRACE, which this process lacks; "
            + PTRACE_REMEDY
        )
    if scope == 1 and not (pid is not None and _is_descendant(pid)):
        return (
            "kernel.yama.ptrace_scope=1 allows tracing only of this process's own "
            "descendants without CAP_SYS_PTRACE, which this process lacks; " + PTRACE_REMEDY
        )
    if pid is not None:
        # without CAP_SYS_PTRACE the target's real, effective and saved uids must all be
        # ours (kernel/ptrace.c: __ptrace_may_access) -- also when we are uid 0
        uids = _proc_uids(pid)
        if uids and any(u != os.getuid() for u in uids[:3]):
            return (
                "pid %d runs as uid %d, this process as uid %d without CAP_SYS_PTRACE; "
                % (pid, uids[0], os.getuid())
                + PTRACE_REMEDY
            )
    return None


def _first_error_line(stderr: Optional[str]) -> str:
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


def _pid_state(pid: int) -> str:
    """'alive' | 'gone' | 'zombie'."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return "gone"
    except OSError:
        return "alive"
    # state is the field after the ')' closing comm (comm may contain spaces and ')')
    state = data[data.rfind(")") + 2 : data.rfind(")") + 3]
    return "zombie" if state in ("Z", "X", "x") else "alive"


def _result(
    pid: int,
    threads: Optional[List[Thread]] = None,
    error: Optional[str] = None,
    remedy: Optional[str] = None,
    t0: Optional[float] = None,
    **extra: Any,
) -> StackResult:
    r = {
        "pid": pid,
        "threads": threads,
        "source": "py-spy" if threads is not None else None,
        "error": error,
        "remedy": remedy,
        "duration_s": (time.monotonic() - t0) if t0 is not None else 0.0,
    }
    r.update(extra)
    return r


def _vanished(pid: int, state: str) -> str:
    if state == "zombie":
        return "process vanished: pid %d has exited (zombie, not yet reaped by its parent)" % pid
    return "process vanished: pid %d no longer exists" % pid


def dump_one(
    pid: int, native: bool = False, timeout_s: float = 10.0, pyspy: Optional[str] = None
) -> StackResult:
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
    nonblocking, before = False, kernelwait.read_syscalls(pid)  # (before py-spy's ptrace stop restarts them)
    try:
        try:
            out = subprocess.run(
                base, capture_output=True, text=True, timeout=timeout_s, env=config.helper_env()
            )
        except subprocess.TimeoutExpired:
            # A process in uninterruptible sleep (D state, e.g. stuck NFS IO) never reaches
            # the ptrace stop py-spy waits for; reading without pausing it still works.
            if _pid_state(pid) != "alive":
                return _result(pid, error=_vanished(pid, _pid_state(pid)), t0=t0)
            nonblocking = True
            try:
                out = subprocess.run(
                    base + ["--nonblocking"],
                    capture_output=True,
                    text=True,
                    timeout=max(1.0, min(timeout_s, 5.0)),
                    env=config.helper_env(),
                )
            except subprocess.TimeoutExpired:
                return _result(
                    pid, error="py-spy timed out after %.1f s (also with --nonblocking)" % timeout_s, t0=t0
                )
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
            return _result(
                pid,
                error="permission denied reading pid %d: %s. %s" % (pid, err, remedy),
                remedy=remedy,
                t0=t0,
            )
        if "failed to find python version" in low or "failed to find python interpreter" in low:
            return _result(
                pid, error="pid %d does not look like a Python process to py-spy (%s)" % (pid, err), t0=t0
            )
        return _result(pid, error="py-spy failed on pid %d (exit %d): %s" % (pid, out.returncode, err), t0=t0)
    try:
        threads = sourcelines.add_source_lines(kernelwait.annotate(pid, normalize_pyspy(out.stdout), before))
    except (ValueError, TypeError, AttributeError) as e:
        return _result(pid, error="py-spy output unreadable: %s: %r" % (e, out.stdout[:200]), t0=t0)
    return _result(pid, threads=threads, t0=t0, nonblocking=nonblocking, children=kernelwait.children(pid))


def dump_stacks(
    pids: Iterable[int],
    native: bool = False,
    timeout_s: float = 10.0,
    max_workers: int = 8,
    pyspy: Optional[str] = None,
) -> Dict[int, StackResult]:
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
         'nonblocking': bool, 'children': [...]}   # these two only on success; children: kernelwait.children

    Exactly one of ``threads`` / ``error`` is set. Error texts: ``"process vanished: ..."``
    (pid gone or zombie, checked before and after the dump), ``"py-spy missing: pip install
    py-spy"``, ``"permission denied reading pid N: ... <remedy>"`` (remedy from
    :func:`ptrace_problem`, naming CAP_SYS_PTRACE, ``sysctl kernel.yama.ptrace_scope=0`` and
    ``docker run --cap-add SYS_PTRACE``), ``"... does not look like a Python process"``,
    ``"py-spy timed out ..."``, or py-spy's own first error line. Never raises for a
    per-process failure. Every py-spy runs with ``config.helper_env()``.
    """
    uniq: List[int] = []
    for p in pids:
        p = int(p)
        if p not in uniq:
            uniq.append(p)
    if not uniq:
        return {}
    exe = pyspy or pyspy_path()
    if len(uniq) == 1 or max_workers <= 1:
        return {p: dump_one(p, native, timeout_s, exe) for p in uniq}
    with ThreadPoolExecutor(
        max_workers=min(max_workers, len(uniq)), thread_name_prefix="hangtrace-pyspy"
    ) as pool:
        futs = {p: pool.submit(dump_one, p, native, timeout_s, exe) for p in uniq}
        return {p: f.result() for p, f in futs.items()}
