"""Collector side of the Flight Recorder agents (``hangtrace.hooks.fr_agent``). Impure.

``request_fr_dumps`` writes a request token into each process's FIFO
``RUN_DIR/fr/<host>-<pid>.req`` and waits until each agent's ``.meta.json`` carries that
token (its dump was written, atomically, before the sidecar).
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import time
from typing import Iterable, List, Optional

from hangtrace.hooks.fr_agent import FR_SUBDIR, dump_path, fifo_path, meta_path


def _token_of(path: str) -> Optional[str]:
    try:
        with open(path, "rb") as f:
            return json.loads(f.read()).get("token")
    except (OSError, ValueError, AttributeError):
        return None


def request_fr_dumps(run_dir: str, pids: Iterable[int], timeout_s: float = 5.0,
                     host: Optional[str] = None) -> List[str]:
    """Ask the agents of ``pids`` (on ``host``, default this one) to dump; wait up to
    ``timeout_s`` seconds in all. Returns the dump paths written in answer (a process
    without a listening agent, or one that did not answer in time, is left out).
    Never raises for a single process.
    """
    host = host or socket.gethostname()
    token = "%d-%d" % (os.getpid(), time.time_ns())
    asked = []
    for pid in pids:
        try:
            fd = os.open(fifo_path(run_dir, host, pid), os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # ENXIO: nobody reads (agent gone); ENOENT: no agent
            continue
        try:
            os.write(fd, (token + "\n").encode())
            asked.append(pid)
        except OSError:
            pass
        finally:
            os.close(fd)
    done: List[str] = []
    deadline = time.monotonic() + timeout_s
    pending = list(asked)
    while pending:
        for pid in list(pending):
            if _token_of(meta_path(run_dir, host, pid)) == token:
                done.append(dump_path(run_dir, host, pid))
                pending.remove(pid)
        if not pending or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    return done


#: Seconds a live snapshot waits in all for the agents' dumps (each takes milliseconds;
#: a process whose agent does not answer is analysed from our ring alone).
SNAPSHOT_FR_TIMEOUT_S = 3.0


def fr_into_snapshot(run_dir: str, pids: Iterable[int], snap_dir: str,
                     timeout_s: float = SNAPSHOT_FR_TIMEOUT_S) -> List[str]:
    """Request dumps from the agents of ``pids`` (this host) and copy each answered dump
    with its sidecar into ``snap_dir/fr/``. Returns the copied dump paths ([] when no
    process runs an agent, e.g. ``HANGTRACE_FR=0`` or no process group). Never raises."""
    if os.environ.get("HANGTRACE_FR", "1") == "0":
        return []
    out: List[str] = []
    try:
        done = request_fr_dumps(run_dir, pids, timeout_s=timeout_s)
        if not done:
            return out
        dst = os.path.join(snap_dir, FR_SUBDIR)
        os.makedirs(dst, mode=0o700, exist_ok=True)
        for path in done:
            meta = path[:-len(".pkl")] + ".meta.json"
            try:
                shutil.copy2(meta, os.path.join(dst, os.path.basename(meta)))
                shutil.copy2(path, os.path.join(dst, os.path.basename(path)))
                out.append(os.path.join(dst, os.path.basename(path)))
            except OSError:
                continue
    except Exception:
        pass
    return out
