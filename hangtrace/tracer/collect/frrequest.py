"""Collector side of the Flight Recorder agents (``hangtrace.hooks.torchdist.fr_agent``). Impure.

``request_fr_dumps`` connects to each process's agent (an abstract Unix socket,
``fr_agent.socket_name``), sends a request token, and waits until the agent answers
``done`` and its ``.meta.json`` carries that token (its dump was written, atomically,
before the sidecar).
"""

from __future__ import annotations

import json
import os
import select
import shutil
import socket
import time
from typing import Dict, Iterable, List, Optional, Set

from hangtrace.tracer import config
from hangtrace.hooks.torchdist.fr_agent import (
    FR_SUBDIR,
    MIN_DUMP_INTERVAL_S,
    PROGRESS,
    dump_path,
    meta_path,
    socket_name,
)


def _answers(path: str, token: str, asked_wall_ns: int) -> bool:
    """Does the sidecar ``path`` answer the request ``token`` sent at ``asked_wall_ns``? Its
    token is ours, or another requester's whose dump is no older than our request less the
    agent's coalescing interval (the node watcher asks too, issue 43: a request of its that
    lands between our answer and our reading of the sidecar retokens it; the dump is as
    new as the one that answered us)."""
    try:
        with open(path, "rb") as f:
            meta = json.loads(f.read())
        if meta.get("token") == token:
            return True
        return int(meta.get("wall_ns") or 0) >= asked_wall_ns - int(MIN_DUMP_INTERVAL_S * 1e9)
    except (OSError, ValueError, AttributeError, TypeError):
        return False


def _ask(
    run_dir: str,
    pids: Iterable[int],
    line: str,
    timeout_s: float,
    settle_s: Optional[float] = None,
    silent: Optional[Set[int]] = None,
) -> Dict[int, str]:
    """Send ``line`` to the agent of each of ``pids`` (this host) and collect the answers
    that arrive within ``timeout_s`` seconds in all: {pid: answer}. ``settle_s``: once
    some agent answered, stop waiting for the rest ``settle_s`` seconds after the latest
    answer (an agent that has not answered by then is not running: its process holds the
    GIL in C code, or is stopped). ``silent`` (a set, filled): the pids whose agent took
    the request and did not answer in time (a pid without a listening agent is not one).
    Never raises."""
    out: Dict[int, str] = {}
    conns: Dict[socket.socket, int] = {}
    for pid in pids:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.settimeout(min(1.0, timeout_s))
            s.connect(socket_name(run_dir, pid))  # ECONNREFUSED / ENOENT: no agent
            s.sendall((line + "\n").encode())
            s.setblocking(False)
            conns[s] = pid
        except OSError:
            s.close()
    deadline = end = time.monotonic() + timeout_s
    try:
        while conns:
            left = end - time.monotonic()
            if left <= 0:
                break
            ready, _, _ = select.select(list(conns), [], [], left)
            for s in ready:
                pid = conns.pop(s)
                try:
                    out[pid] = s.recv(4096).decode("ascii", "replace").strip()
                except OSError:
                    pass
                s.close()
            if ready and settle_s is not None:
                end = min(deadline, time.monotonic() + settle_s)
    finally:
        for s in conns:
            s.close()
    if silent is not None:
        silent.update(conns.values())
    return out


#: Seconds a live snapshot waits for the remaining agents after the latest answer. An
#: agent answers within milliseconds unless its process runs no Python thread at all (a
#: blind job's rank 1 held the GIL in torch.save's C++ open of a stalled file: every
#: snapshot waited the whole SNAPSHOT_FR_TIMEOUT_S for it).
SNAPSHOT_FR_SETTLE_S = 1.5


def request_fr_dumps(
    run_dir: str,
    pids: Iterable[int],
    timeout_s: float = 5.0,
    host: Optional[str] = None,
    settle_s: Optional[float] = None,
    silent: Optional[Set[int]] = None,
) -> List[str]:
    """Ask the agents of ``pids`` (this host's; ``host`` names it in the dump file names,
    default this one) to dump; wait up to ``timeout_s`` seconds in all (and, with
    ``settle_s``, no longer than that after the latest answer). Returns the dump
    paths of the agents that answered (a process without a listening agent, or one that
    did not answer in time, is left out; a Ray actor's agent that joined no process group
    writes its sidecar and tasks file but no dump: its path does not exist). ``silent``: as
    in :func:`_ask`. Never raises for a single process.
    """
    host = host or socket.gethostname()
    asked = time.time_ns()
    token = "%d-%d" % (os.getpid(), asked)
    answers = _ask(run_dir, pids, token, timeout_s, settle_s=settle_s, silent=silent)
    return [
        dump_path(run_dir, host, pid)
        for pid, a in sorted(answers.items())
        if a.startswith("done") and _answers(meta_path(run_dir, host, pid), token, asked)
    ]


def fr_progress(run_dir: str, pids: Iterable[int], timeout_s: float = 0.5) -> Dict[int, str]:
    """Each agent's ``progress_line`` (torch's per-group enqueued/completed counters) for
    ``pids`` on this host: {pid: line}; a process without an agent, or one that did not
    answer within ``timeout_s`` seconds in all, is left out. Writes no file; never raises.
    The node watcher calls it every poll: C++-issued collectives are progress too."""
    return {
        pid: a[len(PROGRESS) :].strip()
        for pid, a in _ask(run_dir, pids, PROGRESS, timeout_s).items()
        if a.startswith(PROGRESS)
    }


#: Seconds a live snapshot waits in all for the agents' dumps (each takes milliseconds;
#: a process whose agent does not answer is analysed from our ring alone).
SNAPSHOT_FR_TIMEOUT_S = 3.0


def answered_files(
    run_dir: str,
    pids: Iterable[int],
    timeout_s: float = SNAPSHOT_FR_TIMEOUT_S,
    silent: Optional[Set[int]] = None,
) -> List[str]:
    """Request dumps from the agents of ``pids`` (this host); the files of those that
    answered, in ``RUN_DIR/fr``: each sidecar, its pending asyncio tasks when it has a
    running loop, and its dump when it has one (a Ray actor that joined no process group
    answers with its tasks only). [] with ``HANGTRACE_FR=0`` or no agent. ``silent``: as in
    :func:`_ask`. Never raises."""
    if os.environ.get(config.FR, "1") == "0":
        return []
    out: List[str] = []
    try:
        for path in request_fr_dumps(
            run_dir, pids, timeout_s=timeout_s, settle_s=SNAPSHOT_FR_SETTLE_S, silent=silent
        ):
            base = path[: -len(".pkl")]
            out.extend(f for f in (base + ".meta.json", base + ".tasks.json", path) if os.path.exists(f))
    except Exception:
        pass
    return out


def fr_into_snapshot(
    run_dir: str,
    pids: Iterable[int],
    snap_dir: str,
    timeout_s: float = SNAPSHOT_FR_TIMEOUT_S,
    silent: Optional[Set[int]] = None,
) -> List[str]:
    """Copy :func:`answered_files` into ``snap_dir/fr/``. Returns the copied dump paths
    (``.pkl``). ``silent``: as in :func:`_ask`. Never raises."""
    out: List[str] = []
    files = answered_files(run_dir, pids, timeout_s, silent=silent)
    if not files:
        return out
    dst = os.path.join(snap_dir, FR_SUBDIR)
    try:  # (not makedirs: a snapshot folder deleted meanwhile is not made again)
        os.mkdir(dst, mode=0o700)
    except FileExistsError:
        pass
    except OSError:
        return out
    for path in files:
        try:
            shutil.copy2(path, os.path.join(dst, os.path.basename(path)))
        except OSError:
            continue
        if path.endswith(".pkl"):
            out.append(os.path.join(dst, os.path.basename(path)))
    return out


def fr_files(run_dir: str, pids: List[int], silent: Optional[Set[int]] = None) -> Dict[str, bytes]:
    """:func:`answered_files` as ``{file name: bytes}``, for a snapshot's ``fr/`` assembled
    elsewhere (``ray/raynode.collect_node``: a Ray actor's tasks carry the await chains of
    its event loop). ``silent``: as in :func:`_ask`. Never raises ({} when no agent answers)."""
    out: Dict[str, bytes] = {}
    for path in answered_files(run_dir, pids, silent=silent) if pids else ():
        try:
            with open(path, "rb") as f:
                out[os.path.basename(path)] = f.read()
        except OSError:
            continue
    return out
