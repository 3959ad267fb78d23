"""Facts about processes read from /proc (Linux): light, imported by traced processes too."""

import os
from typing import Optional

__all__ = ["proc_start_ticks"]

def proc_start_ticks(pid: int, default: Optional[int] = 0) -> Optional[int]:
    """Start time of ``pid`` in clock ticks since boot (/proc/PID/stat field 22), or
    ``default`` when the process does not exist or cannot be read. Tells a reused pid
    from the process that wrote a ring (proc(5): the value never changes, even at exec)."""
    try:
        # a raw descriptor, not open(): no buffered file object (this runs in every
        # forked child's after-fork handler, issue 13); the line is < 1 KiB (comm <= 16 bytes)
        fd = os.open("/proc/%d/stat" % pid, os.O_RDONLY | os.O_CLOEXEC)
        try:
            data = os.read(fd, 4096)
        finally:
            os.close(fd)
        return int(data.rsplit(b")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return default
