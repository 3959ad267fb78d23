"""File locks from the kernel's table (``/proc/locks``, proc(5)): who holds a lock on a file,
and which files a process holds locks on. Impure (reads /proc); never raises.

A line: ``1: FLOCK  ADVISORY  WRITE 812 08:01:1234 0 EOF`` (a holder) or ``1: -> FLOCK ...``
(a process waiting for it); the file is ``major:minor:inode`` (hex:hex:decimal). A rank
blocked in ``flock`` names its holder (collect/kernelwait.py); a rank that holds a lock
while it waits for the others (blind helper 59: ``filelock`` around ``init_process_group``)
carries the files it holds.
"""

from __future__ import annotations

import os
from typing import List, Optional, Tuple

FileKey = Tuple[int, int, int]  # (major, minor, inode) of a file's device and inode

_MAX_HELD = 8  # files named per process


def lock_table(text: Optional[str] = None) -> List[Tuple[int, FileKey]]:
    """``[(pid, file key)]`` of every held lock (waiters' ``->`` lines left out) in
    ``/proc/locks``, or in ``text`` when given (tests)."""
    if text is None:
        try:
            with open("/proc/locks", "r") as f:
                text = f.read(1 << 20)
        except (OSError, ValueError):
            return []
    out: List[Tuple[int, FileKey]] = []
    for line in text.splitlines():
        cols = line.split()
        if len(cols) < 6 or "->" in cols[:2]:
            continue
        try:
            maj, mnr, ino = cols[5].split(":")
            out.append((int(cols[4]), (int(maj, 16), int(mnr, 16), int(ino))))
        except ValueError:
            continue
    return out


def _key(path: str) -> FileKey:
    st = os.stat(path)
    return os.major(st.st_dev), os.minor(st.st_dev), st.st_ino


def lock_holders(path: str, waiter: int, locks_text: Optional[str] = None) -> List[int]:
    """The pids other than ``waiter`` holding a lock (``flock``, POSIX or OFD) on the file
    ``path`` names; [] when unknown."""
    try:
        key = _key(path)
    except OSError:
        return []
    out: List[int] = []
    for pid, k in lock_table(locks_text):
        if k == key and pid != waiter and pid > 0 and pid not in out:
            out.append(pid)
    return out


def held_locks(pid: int, locks_text: Optional[str] = None) -> List[str]:
    """The files ``pid`` holds a lock on, by the path of its descriptor on each (at most
    ``_MAX_HELD``); [] when it holds none or we may not look."""
    keys = {k for p, k in lock_table(locks_text) if p == pid}
    out: List[str] = []
    try:
        names = os.listdir("/proc/%d/fd" % pid) if keys else []
    except OSError:
        return out
    for n in names:
        try:
            if _key("/proc/%d/fd/%s" % (pid, n)) in keys:
                path = os.readlink("/proc/%d/fd/%s" % (pid, n))
                if path not in out:
                    out.append(path)
        except OSError:
            continue
        if len(out) >= _MAX_HELD:
            break
    return out
