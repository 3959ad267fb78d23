"""faulthandler stacks on request: make a live process write its stacks, read them back.

In: a pid, the signal it registered ``faulthandler.register`` for and the file it writes
to (its ring header's dump signal). Out: its threads (thread format of
``stackmodel/threads.py``, parsed by ``stackmodel/faulthandler_text.py``), or None. A dump
can be requested with a signal only from a process that registered for it: in Ray workers
SIGUSR1 is SIG_DFL and kills.
"""

from __future__ import annotations

import os
import time
from typing import List, Optional

from hangtrace.tracer.stackmodel.faulthandler_text import parse_faulthandler_text
from hangtrace.tracer.stackmodel.threads import Thread


def signal_caught(pid: int, signum: int) -> bool:
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


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def request_faulthandler_dump(
    pid: int, signum: int, dump_file: str, timeout_s: float = 3.0, *, registered: bool = True
) -> Optional[List[Thread]]:
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
    from hangtrace.tracer.collect.stacks import _pid_state

    if not registered or not signal_caught(pid, signum):
        return None
    start = _size(dump_file)
    try:
        os.kill(int(pid), int(signum))
    except (ProcessLookupError, PermissionError):
        return None
    deadline = time.monotonic() + timeout_s
    last, stable_since = start, 0.0
    while time.monotonic() < deadline:
        time.sleep(0.01)
        size = _size(dump_file)
        if size < start:  # file was truncated/rewritten: read from the beginning
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
