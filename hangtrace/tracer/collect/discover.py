"""Find the torch.distributed worker processes on this host (for ``hangtrace attach``).

Source of truth is each process's *initial* environment, ``/proc/PID/environ`` (via
psutil). Variables set later with ``os.environ[...] = ...`` inside the process (as Ray
actors of RL frameworks do for RANK/WORLD_SIZE) are not visible there (proc(5):
environ shows the block the process was exec'ed with); such processes are found
through their ring files instead, or by passing their pids.
"""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Mapping, Optional, Tuple, Union

from hangtrace.tracer import config

if TYPE_CHECKING:
    import psutil

#: One process found (keys: see ``find_torch_processes``).
Found = Dict[str, Any]

#: Variables whose presence marks a torch.distributed process (torchrun / torch.distributed
#: launchers and most schedulers set them; see torch docs "torchrun (Elastic Launch)").
TORCH_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID", "MASTER_ADDR", "GROUP_RANK")
#: Variables copied into each result's ``env``.
ENV_KEYS = TORCH_ENV + (
    "MASTER_PORT",
    "LOCAL_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_NAME",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "NODE_RANK",
    "CUDA_VISIBLE_DEVICES",
    config.ENABLE,
    config.DIR,
    config.RUN_ID,
)


class DiscoveryResult(list[Found]):
    """A list of process dicts, plus ``skipped``: ``[{'pid': int, 'reason': str}]`` for
    processes that could not be examined (environ unreadable, gone, not torch)."""

    def __init__(
        self, items: Iterable[Found] = (), skipped: Optional[Iterable[Dict[str, Any]]] = None
    ) -> None:
        super().__init__(items)
        self.skipped = list(skipped or [])


def _int(env: Mapping[str, str], key: str) -> int:
    try:
        return int(env.get(key, ""))
    except (TypeError, ValueError):
        return -1


def _is_python(proc: psutil.Process, cmdline: List[str]) -> bool:
    names: List[str] = []
    try:
        names.append(os.path.basename(proc.exe() or ""))
    except Exception:
        pass
    if cmdline:
        names.append(os.path.basename(cmdline[0]))
        if cmdline[0].startswith("ray::"):  # Ray workers rename themselves (setproctitle)
            return True
    try:
        names.append(proc.name())
    except Exception:
        pass
    return any(n.startswith(("python", "pypy")) for n in names if n)


def _describe(proc: psutil.Process, env: Mapping[str, str], host: str) -> Found:
    try:
        cmdline = proc.cmdline()
    except Exception:
        cmdline = []
    try:
        ppid = proc.ppid()
    except Exception:
        ppid = None
    try:
        start = proc.create_time()
    except Exception:
        start = None
    try:
        uid = proc.uids().real
    except Exception:
        uid = None
    try:
        sid = os.getsid(proc.pid)
    except OSError:
        sid = None
    return {
        "pid": proc.pid,
        "ppid": ppid,
        "host": host,
        "rank": _int(env, "RANK"),
        "local_rank": _int(env, "LOCAL_RANK"),
        "world_size": _int(env, "WORLD_SIZE"),
        "run_id": env.get("TORCHELASTIC_RUN_ID", ""),
        "cmdline": cmdline,
        "start_time": start,
        "uid": uid,
        "sid": sid,
        "python": _is_python(proc, cmdline),
        "env": {k: env[k] for k in ENV_KEYS if k in env},
    }


#: command-line marks of multiprocessing's own helper processes (``-c 'from
#: multiprocessing.resource_tracker import main;main(3)'``, the forkserver): they inherit a
#: rank's environment (RANK included) and are never ranks (a blind job, 2026-12-04: attach
#: named the resource tracker "rank 0" and blamed its pipe read)
_MP_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def _mp_helper(cmdline: List[str]) -> bool:
    return any(m in c for c in cmdline for m in _MP_HELPERS)


def _job_key(d: Found) -> Tuple[str, str, str, str, int]:
    e = d["env"]
    return (
        e.get("TORCHELASTIC_RUN_ID", ""),
        e.get("MASTER_ADDR", ""),
        e.get("MASTER_PORT", ""),
        e.get("WORLD_SIZE", ""),
        d["rank"],
    )


def _prefer_leaves(cands: List[Found]) -> List[Found]:
    """Keep the rank processes, drop launchers, wrappers and forked helpers.

    1. If any candidate has RANK, drop those without (torchrun/launcher parents usually
       lack RANK; a shell exporting MASTER_ADDR too) - except the ranks inferred from a
       tool they started (``_python_parents``): another job's RANK must not hide them.
    2. Within one job and rank, drop non-Python wrappers (``bash -c``/``srun`` shells) when
       a Python process exists, then keep the topmost Python processes: forked children of
       a rank (DataLoader workers, compile workers) inherit its environment but are not the
       rank. Except the children a launcher started with multiprocessing's spawn
       (``torch.multiprocessing.spawn`` from a launcher whose environment holds RANK=0: the
       children inherit it and set their own rank in Python): they are the ranks, their
       parent the launcher (blind helper 56: attach took the launcher for rank 0 and left
       the ranks out).
    """
    with_rank = [d for d in cands if d["rank"] >= 0 or d.get("inferred_from")]
    if with_rank:
        cands = with_rank
    groups: Dict[Tuple[str, str, str, str, int], List[Found]] = {}
    for d in cands:
        groups.setdefault(_job_key(d), []).append(d)
    keep: List[Found] = []
    for members in groups.values():
        if len(members) > 1:
            py = [d for d in members if d["python"]]
            if py:
                members = py
            by_pid = {d["pid"]: d for d in members}
            spawned = [
                d for d in members if _spawned(d) and d["ppid"] in by_pid and not _spawned(by_pid[d["ppid"]])
            ]
            members = spawned or [d for d in members if d["ppid"] not in by_pid] or members
        keep.extend(members)
    return keep


def _spawned(d: Found) -> bool:
    """A process started by multiprocessing's spawn (``torch.multiprocessing.spawn``'s ranks:
    ``python -c 'from multiprocessing.spawn import spawn_main; ...'``), not a fork."""
    return any("spawn_main" in str(c) for c in d["cmdline"])


def _python_parents(found: List[Found], psutil: Any, host: str, skipped: List[Dict[str, Any]]) -> List[Found]:
    """A scan's non-Python processes are no ranks. One whose parent is a Python process
    not found itself (a ``cat``, ``tar`` or shell a rank started after setting
    ``MASTER_ADDR``/``RANK`` in ``os.environ``: the torch tutorial's ``setup(rank,
    world_size)`` inside ``mp.spawn``) inherited the variables the parent's
    ``/proc/PID/environ`` does not show: the parent is taken instead, with its Python
    siblings (the other workers of that launcher, its resource tracker aside), each with
    ``inferred_from`` (the child's pid). Other non-Python processes are dropped unless a
    Python process of the same job was found (``_prefer_leaves`` drops those wrappers).

    The parent is inferred only when no Python process of the child's job was found (then
    the child is a wrapper such as ``srun`` or ``bash -c`` of ranks that are visible) and
    the parent runs as the child's user (a launcher that starts a job as another user, or a
    test harness passing ``env=``, is not a rank)."""
    pids = {d["pid"] for d in found}
    keys = {_job_key(d)[:4] for d in found if d["python"]}
    out = [d for d in found if d["python"] or _job_key(d)[:4] in keys]
    for d in found:
        if d["python"] or d["ppid"] in pids or not d["ppid"] or _job_key(d)[:4] in keys:
            continue
        try:
            parent = psutil.Process(d["ppid"])
            if d["uid"] is None or parent.uids().real != d["uid"]:
                continue
            family = [parent] + [c for c in psutil.Process(parent.ppid()).children() if c.pid != parent.pid]
        except Exception:
            continue
        for proc in family:
            try:
                cmd = proc.cmdline()
                if proc.pid in pids or not _is_python(proc, cmd) or _mp_helper(cmd):
                    continue
                found_env = proc.environ()
            except Exception as e:
                skipped.append({"pid": proc.pid, "reason": "cannot examine: %s" % e})
                continue
            desc = _describe(proc, found_env, host)
            desc["inferred_from"] = d["pid"]
            out.append(desc)
            pids.add(proc.pid)
    return out


def find_torch_processes(
    pids: Optional[Iterable[Union[int, str]]] = None, include_all: bool = False
) -> DiscoveryResult:
    """torch.distributed processes on this host, sorted by rank (then pid).

    ``pids``: examine exactly these (a pid whose environment lacks torch variables is still
    returned, with rank -1); default: scan every process whose ``/proc/PID/environ`` holds
    one of ``TORCH_ENV``. Our own process and hangtrace helpers (``HANGTRACE_HELPER`` in
    their environment) are skipped. In a scan, launchers and forked helpers are dropped
    (see ``_prefer_leaves``) unless ``include_all``.

    Returns a :class:`DiscoveryResult` (a list) of dicts ``{pid, ppid, host, rank,
    local_rank, world_size (-1 when unset), run_id (TORCHELASTIC_RUN_ID or ''), cmdline
    (list), start_time (Unix s), uid (real user id), sid (session id), python (bool), env
    (subset: ENV_KEYS)}`` (uid, sid, start_time: None when unreadable); its
    ``skipped`` lists ``{pid, reason}`` for processes whose environ could not be read
    (another user without CAP_SYS_PTRACE/root: "access denied"), that vanished, or
    (explicit pids) do not exist.
    """
    import psutil

    host = socket.gethostname()
    me = os.getpid()
    found: List[Found] = []
    skipped: List[Dict[str, Any]] = []
    procs: Iterable[psutil.Process]
    if pids is not None:
        procs = []
        for p in pids:
            try:
                procs.append(psutil.Process(int(p)))
            except psutil.NoSuchProcess:
                skipped.append({"pid": int(p), "reason": "no such process"})
            except (psutil.AccessDenied, ValueError) as e:
                skipped.append({"pid": p, "reason": "cannot examine: %s" % e})
    else:
        procs = psutil.process_iter()
    for proc in procs:
        if proc.pid == me:
            continue
        try:
            env = proc.environ()
        except psutil.ZombieProcess:  # a subclass of NoSuchProcess: test it first
            if pids is not None:
                skipped.append({"pid": proc.pid, "reason": "zombie (exited, not reaped)"})
            continue
        except psutil.NoSuchProcess:
            if pids is not None:
                skipped.append({"pid": proc.pid, "reason": "process vanished"})
            continue
        except psutil.AccessDenied:
            if pids is None and os.geteuid() == 0:
                continue  # denied even to root (a sandbox's init, a kernel helper): no job of a user
            skipped.append(
                {
                    "pid": proc.pid,
                    "reason": (
                        "access denied reading /proc/%d/environ: run as the job's user, as root, or "
                        "with CAP_SYS_PTRACE" % proc.pid
                    ),
                }
            )
            continue
        except OSError as e:
            skipped.append({"pid": proc.pid, "reason": "cannot read environ: %s" % e})
            continue
        if env.get(config.HELPER):
            continue
        if pids is None and not any(k in env for k in TORCH_ENV):
            continue
        desc = _describe(proc, env, host)
        if pids is None and _mp_helper(desc["cmdline"]):
            continue  # multiprocessing's resource tracker / forkserver: inherits RANK, never a rank
        found.append(desc)
    if pids is None:
        found = _python_parents(found, psutil, host, skipped)
    if pids is None and not include_all:
        found = _prefer_leaves(found)
    found.sort(key=lambda d: (d["rank"] < 0, d["rank"], d["pid"]))
    return DiscoveryResult(found, skipped)
