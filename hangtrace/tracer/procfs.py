"""Facts about processes read from /proc (Linux): light, imported by traced processes too."""

from typing import Optional

__all__ = ["proc_start_ticks"]

def proc_start_ticks(pid: int, default: Optional[int] = 0) -> Optional[int]:
    """Start time of ``pid`` in clock ticks since boot (/proc/PID/stat field 22), or
    ``default`` when the process does not exist or cannot be read. Tells a reused pid
    from the process that wrote a ring (proc(5): the value never changes, even at exec)."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return default
