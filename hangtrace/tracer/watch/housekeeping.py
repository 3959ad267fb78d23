"""Run-directory housekeeping (issue 13): find runs, gather their facts, delete per plan.

Impure side of ``tracer.watch.retention`` (which decides). Used by ``hangtrace gc`` and,
unless ``HANGTRACE_GC=0``, by ``hangtrace run`` when it starts a run in the default location.

Which directories are candidates:

- default location (``tempfile.gettempdir()``, i.e. ``$TMPDIR`` or ``/tmp``): only
  directories named exactly as hangtrace names a run it placed there itself,
  ``hangtrace-<UTC yyyymmdd-HHMMSS>-<pid>`` (``hooks/state.default_run_id``), and the
  folders ``hangtrace attach`` wrote there, ``hangtrace-attach-<UTC yyyymmddTHHMMSS>-<pid>``,
  owned by this user. A directory the user named (``HANGTRACE_DIR``, ``--dir``, or a run id of
  their own in ``HANGTRACE_RUN_ID``) does not match and is never touched;
- ``--dir BASE`` given explicitly: every subdirectory of BASE that holds a run (a ring
  file, ``hangtrace.log`` or ``snapshots/``), owned by this user.

Which processes keep a run alive: every ``ring-*.htr`` whose header names a process on this
host that still runs (pid + start ticks, ``collect.ringprocs.live_state``), and every
``<role>-<host>.pid`` file (``watcher-<host>.pid`` from ``hooks/autowatch``,
``run-<host>.pid`` from ``hangtrace run``) whose pid runs and started before the file was
written (a reused pid started later).
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass
from typing import Callable

from hangtrace.tracer import config
from hangtrace.tracer.watch.retention import MIB, Plan, Policy, RunFacts, plan, protection

#: Name of a run directory hangtrace placed in the default location itself.
DEFAULT_NAME_RE = re.compile(r"^hangtrace-\d{8}-\d{6}-\d+$")
#: Name of the snapshot folder ``hangtrace attach`` placed there (``collect/attach.py``).
ATTACH_NAME_RE = re.compile(r"^hangtrace-attach-\d{8}T\d{6}-\d+$")
_HOST = socket.gethostname()


@dataclass(frozen=True)
class GcResult:
    """What an execution did: paths deleted (oldest first), bytes on disk freed, runs
    spared because they came alive or were written since the plan, and errors (one line each)."""

    deleted: tuple[str, ...]
    freed_bytes: int
    spared: tuple[str, ...]
    errors: tuple[str, ...]


def default_base() -> str:
    """The default location of run directories: ``tempfile.gettempdir()`` (``$TMPDIR``)."""
    return tempfile.gettempdir()


def policy_from_env(
    environ: dict | None = None, keep: int | None = None, max_mb: float | None = None
) -> Policy:
    """Policy from ``HANGTRACE_GC_KEEP``/``HANGTRACE_GC_MAX_MB``, overridden by flags."""
    k = keep if keep is not None else config.get_int(config.GC_KEEP, environ)
    mb = max_mb if max_mb is not None else config.get_float(config.GC_MAX_MB, environ)
    return Policy(keep=max(0, int(k)), max_bytes=max(0, int(mb * MIB)))


def is_run_dir(path: str) -> bool:
    """True when ``path`` holds a hangtrace run (a ring file, ``hangtrace.log`` or ``snapshots/``)
    or is a folder ``hangtrace attach`` wrote (``processes.json``)."""
    return (
        os.path.exists(os.path.join(path, "hangtrace.log"))
        or os.path.isdir(os.path.join(path, "snapshots"))
        or bool(glob.glob(os.path.join(path, "ring-*.htr")))
        or os.path.exists(os.path.join(path, "processes.json"))  # a `hangtrace attach` folder
    )


def find_runs(base: str, explicit: bool) -> list[str]:
    """Candidate run directories directly under ``base`` (see the module docstring).

    Symbolic links and other users' directories are never candidates. Raises OSError when
    ``base`` cannot be listed.
    """
    out = []
    uid = os.getuid()
    for e in os.scandir(base):
        try:
            if not e.is_dir(follow_symlinks=False) or e.stat(follow_symlinks=False).st_uid != uid:
                continue
        except OSError:
            continue
        if explicit:
            if is_run_dir(e.path):
                out.append(os.path.abspath(e.path))
        elif DEFAULT_NAME_RE.match(e.name) or ATTACH_NAME_RE.match(e.name):
            out.append(os.path.abspath(e.path))
    return sorted(out)


def _sizes(path: str) -> tuple[int, int, float]:
    """(bytes on disk, apparent bytes, newest mtime of path and its top-level entries but
    pid files)."""
    disk = apparent = 0
    newest = 0.0
    seen: set[tuple[int, int]] = set()
    for root, dirs, files in os.walk(path):
        for n in files + dirs:
            try:
                st = os.lstat(os.path.join(root, n))
            except OSError:
                continue
            if root == path and not n.endswith(".pid"):  # a pid file is written once, at start
                newest = max(newest, st.st_mtime)
            if n in dirs and not os.path.islink(os.path.join(root, n)):
                disk += st.st_blocks * 512
                continue
            if st.st_nlink > 1:
                if (st.st_dev, st.st_ino) in seen:
                    continue
                seen.add((st.st_dev, st.st_ino))
            disk += st.st_blocks * 512
            apparent += st.st_size
    try:
        st = os.lstat(path)
        newest = max(newest, st.st_mtime)
        disk += st.st_blocks * 512
    except OSError:
        pass
    return disk, apparent, newest


def _boot_time_s() -> float:
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("btime "):
                return float(line.split()[1])
    raise OSError("no btime in /proc/stat")


def _pid_started_before(pid: int, when_s: float) -> bool:
    """True when ``pid`` runs (not a zombie) and started no later than ``when_s`` (+2 s)."""
    from hangtrace.tracer.ring.layout import proc_start_ticks

    ticks = proc_start_ticks(pid, None)
    if ticks is None:
        return False
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            if f.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X"):
                return False
        started = _boot_time_s() + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return True  # it runs; when it started is unknown: keep the run
    return started <= when_s + 2.0


def liveness(path: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(live, unknown)`` descriptions of the processes of the run at ``path`` (see module)."""
    from hangtrace.tracer.collect.ringprocs import live_state
    from hangtrace.tracer.ring.layout import HEADER_SIZE
    from hangtrace.tracer.ring.reader import read_header

    live: list[str] = []
    unknown: list[str] = []
    for ring in sorted(glob.glob(os.path.join(path, "ring-*.htr"))):
        try:
            with open(ring, "rb") as f:
                hdr = read_header(f.read(HEADER_SIZE), ring)
        except Exception:
            continue  # torn or foreign file: no process to protect (fresh runs are kept by age)
        who = "%spid %d on %s" % (
            "rank %d " % hdr["rank"] if hdr["rank"] >= 0 else "",
            hdr["pid"],
            hdr["host"],
        )
        state = live_state(hdr)
        if state == "alive":
            live.append(who)
        elif state == "unknown":
            unknown.append(who)
    for pf in sorted(glob.glob(os.path.join(path, "*-*.pid"))):
        role, _, host = os.path.basename(pf)[:-4].partition("-")
        try:
            with open(pf) as f:
                pid = int(f.read().strip() or 0)
            mtime = os.stat(pf).st_mtime
        except (OSError, ValueError):
            continue
        if pid <= 0:
            continue
        who = "%s pid %d on %s" % (role, pid, host)
        if host != _HOST:
            unknown.append(who)
        elif _pid_started_before(pid, mtime):
            live.append(who)
    return tuple(live), tuple(unknown)


def run_facts(path: str) -> RunFacts:
    """Gather the facts the policy needs about the run directory ``path``."""
    disk, apparent, newest = _sizes(path)
    live, unknown = liveness(path)
    return RunFacts(
        path=path, last_active_s=newest, disk_bytes=disk, apparent_bytes=apparent, live=live, unknown=unknown
    )


def scan(base: str, explicit: bool) -> tuple[RunFacts, ...]:
    """Facts of every candidate run under ``base``. Raises OSError when ``base`` cannot be listed."""
    return tuple(run_facts(p) for p in find_runs(base, explicit) if os.path.isdir(p))


def execute(p: Plan) -> GcResult:
    """Delete the runs ``p`` marks, oldest first. Each run's facts are gathered again just
    before its deletion: one that came alive or was written since the plan is spared.
    Never raises for a run that cannot be deleted: it becomes an error line."""
    deleted, spared, errors = [], [], []
    freed = 0
    for d in p.to_delete:
        path = d.run.path
        try:
            now = run_facts(path)
        except OSError as e:
            errors.append("%s: %s" % (path, e))
            continue
        if protection(now, p.policy, time.time()) is not None:
            spared.append(path)
            continue
        failed: list[str] = []
        shutil.rmtree(path, onerror=lambda fn, f, exc: failed.append("%s: %s" % (f, exc[1])))
        if failed:
            errors.extend(failed[:3])
        else:
            deleted.append(path)
            freed += now.disk_bytes
    for d in p.kept:
        if not d.run.live and not d.run.unknown:
            tidy(d.run.path)
    return GcResult(tuple(deleted), freed, tuple(spared), tuple(errors))


def tidy(path: str) -> int:
    """In a run kept whose processes are all gone: remove the empty stack files (a process
    killed before its clean exit leaves them) and the folders left empty, the run's own
    folder aside. Returns the number of entries removed; never raises."""
    n = 0
    for root, dirs, files in os.walk(path, topdown=False):
        if os.path.basename(root) == "stacks":
            n += sum(_unlink_if_empty(os.path.join(root, f)) for f in files)
        if root != path:
            try:
                os.rmdir(root)  # only when empty
                n += 1
            except OSError:
                pass
    return n


def _unlink_if_empty(path: str) -> int:
    """Remove ``path`` when it is an empty file: 1 when removed, else 0; never raises."""
    try:
        if os.lstat(path).st_size == 0:
            os.unlink(path)
            return 1
    except OSError:
        pass
    return 0


#: a stack file's name: ``<kind>-<host>-<pid>.txt`` (``hooks/process/lifecycle.py``)
_STACK_FILE = re.compile(r"^[a-z]+-(?P<host>.+)-(?P<pid>\d+)\.txt$")


def tidy_gone(path: str, host: str = "", wait_s: float = 0.0) -> int:
    """At the end of ``hangtrace run``: remove the empty stack files in ``path/stacks`` of
    processes of this host (``host``; default this machine's name) that are gone (a process
    killed before its clean exit leaves its empty file; a live one keeps its file, which its
    faulthandler may still write), and the folder when it is left empty. ``wait_s``: how long
    to wait for the owners of empty files to be gone (the ranks of a job stopped with
    ``--stop-on-stall`` still exit after their launcher: seen, 8 empty files left by the demo).
    A zombie is gone. Returns the number of files removed; never raises."""
    host = host or socket.gethostname()
    d = os.path.join(path, "stacks")
    try:
        names = os.listdir(d)
    except OSError:
        return 0
    owners = {}
    for f in names:
        m = _STACK_FILE.match(f)
        if m is not None and m.group("host") == host and _empty(os.path.join(d, f)):
            owners[f] = int(m.group("pid"))
    deadline = time.monotonic() + wait_s
    while any(map(_alive, owners.values())) and time.monotonic() < deadline:
        time.sleep(0.1)
    n = sum(_unlink_if_empty(os.path.join(d, f)) for f, pid in owners.items() if not _alive(pid))
    try:
        os.rmdir(d)  # only when empty
    except OSError:
        pass
    return n


def _empty(path: str) -> bool:
    try:
        return os.lstat(path).st_size == 0
    except OSError:
        return False


def _alive(pid: int) -> bool:
    """Does ``pid`` run (a zombie does not; another user's process counts as running)?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # (another user's process of that pid: not ours to judge)
    from hangtrace.tracer.collect.ringprocs import gone_or_zombie

    return not gone_or_zombie(pid)


def auto_prune(log: Callable[[str], None], environ: dict | None = None) -> GcResult | None:
    """What ``hangtrace run`` calls when it starts a run in the default location: the default
    policy (``HANGTRACE_GC_KEEP``, ``HANGTRACE_GC_MAX_MB``) over the default location. Logs one
    line when it deleted something. Returns None when ``HANGTRACE_GC=0``. Never raises."""
    if not config.gc_enabled(environ):
        return None
    try:
        base = default_base()
        pol = policy_from_env(environ)
        res = execute(plan(scan(base, explicit=False), pol, time.time()))
        if res.deleted:
            log(
                "removed %d old run director%s from %s (%.1f MiB; keeping the newest %d runs and at most "
                "%.0f MiB; HANGTRACE_GC=0 turns this off)"
                % (
                    len(res.deleted),
                    "y" if len(res.deleted) == 1 else "ies",
                    base,
                    res.freed_bytes / MIB,
                    pol.keep,
                    pol.max_bytes / MIB,
                )
            )
        return res
    except Exception as e:  # housekeeping must never stop a run
        log("cleaning old run directories failed: %r" % (e,))
        return None
