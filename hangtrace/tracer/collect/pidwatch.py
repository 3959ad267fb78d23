"""Is a watched process still alive, without reading /proc at every poll (issue 40, item 4).

``ringprocs.live_state`` tells whether the process of a ring header still runs: its pid's
start time (/proc/PID/stat field 22) equals the one the ring recorded, and it is no zombie.
That costs two /proc reads per process, and the node watcher asks it several times per
process and poll: at 64 local processes it was most of a poll's CPU. A process that has
been seen alive once needs no /proc read again: a pidfd (pidfd_open(2), Linux 5.3) refers
to that very process (a reused pid is another process) and becomes readable when it exits
(a zombie included). One epoll set holds the pidfds of the processes seen alive; a poll
with a zero timeout returns only those that exited since. So, once enabled
(:func:`enable`, by the watcher's process), the cost of an answer is one ``epoll_wait``
and a dict lookup, whatever the number of processes; /proc is read once per process, when
it is first asked about.

Where pidfds are not available (an older kernel, a seccomp filter, the descriptor limit
reached: at most :data:`MAX_PIDFDS` are held) or the ring recorded no start time, the
answer is ``None``: the caller reads /proc as before. A forked child drops the registry (the
descriptors are close-on-exec; the epoll set would be shared) and reads /proc.
"""

from __future__ import annotations

import os
import select
import time
from typing import Callable, Dict, Optional, Set, Tuple

#: At most this many pidfds are held (the rest of the processes are checked through /proc).
MAX_PIDFDS = 4096

#: Seconds between two readings of the epoll set (the watcher polls every 0.1 s or more).
DRAIN_S = 0.01

Key = Tuple[int, int]  # (pid, start time in clock ticks since boot)


class PidWatch:
    """pidfds of the processes seen alive, in one epoll set (see the module docstring).

    ``ticks_of(pid)`` reads a pid's start time (/proc/PID/stat field 22), or None when gone."""

    def __init__(self, ticks_of: Callable[[int], Optional[int]]) -> None:
        self.ticks_of = ticks_of
        self.drained = float("-inf")  # monotonic time of the last drain
        self.ep: Optional[select.epoll] = None
        self.fds: Dict[int, Key] = {}  # pidfd -> the process it refers to
        self.alive: Dict[Key, int] = {}  # process -> its pidfd
        self.gone: Set[Key] = set()
        self.broken = not hasattr(os, "pidfd_open")

    def answer(self, pid: int, ticks: int) -> Optional[bool]:
        """True: the process (pid, start ticks) is alive and no zombie; False: it exited (or is
        a zombie); None: not known here (the caller reads /proc). Never raises."""
        if self.broken or not ticks:
            return None
        try:
            self._drain()
            key = (pid, ticks)
            if key in self.gone:
                return False
            return True if key in self.alive else None
        except Exception:
            self.broken = True
            return None

    def seen_alive(self, pid: int, ticks: int) -> None:
        """Hold a pidfd for the process (pid, start ticks), which /proc has just shown alive
        and no zombie. The pid's start time is read again after the pidfd is open: a pid
        reused in between is not held. Never raises."""
        if self.broken or not ticks or (pid, ticks) in self.alive or len(self.fds) >= MAX_PIDFDS:
            return
        try:
            if self.ep is None:
                self.ep = select.epoll()
            fd = os.pidfd_open(pid)
        except Exception:
            return  # gone meanwhile, or not allowed: /proc answers next time
        try:
            if self.ticks_of(pid) != ticks:
                os.close(fd)
                return
            self.ep.register(fd, select.EPOLLIN)
            self.fds[fd], self.alive[(pid, ticks)] = (pid, ticks), fd
        except Exception:
            os.close(fd)

    def _drain(self) -> None:
        """Move the processes whose pidfd became readable (exited) to ``gone`` (at most every
        :data:`DRAIN_S`: the answers of one watcher poll are one reading)."""
        if self.ep is None or not self.fds:
            return
        now = time.monotonic()
        if now - self.drained < DRAIN_S:
            return
        self.drained = now
        for fd, _ev in self.ep.poll(0):
            key = self.fds.pop(fd, None)
            try:
                self.ep.unregister(fd)
            finally:
                os.close(fd)
            if key is not None:
                self.alive.pop(key, None)
                self.gone.add(key)


_WATCH: Optional[PidWatch] = None


def enable(ticks_of: Callable[[int], Optional[int]]) -> None:
    """Answer liveness from pidfds in this process from now on (the node watcher's)."""
    global _WATCH
    if _WATCH is None:
        _WATCH = PidWatch(ticks_of)
        os.register_at_fork(after_in_child=_forget)


def _forget() -> None:
    """In a forked child: the registry is the parent's (its epoll set is shared): closed here."""
    global _WATCH
    w, _WATCH = _WATCH, None
    if w is not None:
        for fd in [*w.fds, *([w.ep.fileno()] if w.ep is not None else [])]:
            try:
                os.close(fd)  # (the child's copies: the parent's registrations stay)
            except OSError:
                pass


def registry() -> Optional[PidWatch]:
    """The process's registry when :func:`enable` was called, else None."""
    return _WATCH
