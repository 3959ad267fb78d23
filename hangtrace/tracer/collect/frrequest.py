"""Collector side of the Flight Recorder agents (``hangtrace.hooks.fr_agent``). Impure.

``request_fr_dumps`` writes a request token into each process's FIFO
``RUN_DIR/fr/<host>-<pid>.req`` and waits until each agent's ``.meta.json`` carries that
token (its dump was written, atomically, before the sidecar).
"""
from __future__ import annotations

import json
import os
import socket
import time
from typing import Iterable, List, Optional

from hangtrace.hooks.fr_agent import dump_path, fifo_path, meta_path


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
