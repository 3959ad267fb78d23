"""A forked child's memory sampler reuses its parent's cgroup files (issue 13).

A process forked by a traced one (a DataLoader worker) starts in its parent's memory
cgroup and inherits the parent's open descriptors of that cgroup's files (usage, oom
counter, the limits of it and its ancestors: per cgroup, not per process). The child's
sampler takes them over (``adopt``) instead of parsing ``/proc/PID/mountinfo`` and opening
them again (``Sampler._check_cgroup``: about half a millisecond of every fork here), when
its ``/proc/PID/cgroup`` reads as the parent's did; the timer thread's ``_check_cgroup``
still follows a later move to another cgroup. Imported by the sampler's timer thread, not
at start-up, so that forked children find it loaded. Standard library only; never raises.
"""
from __future__ import annotations

import os
from typing import Any, NamedTuple, Optional, Tuple


class CgroupFiles(NamedTuple):
    """The cgroup a sampler found (``/proc/PID/cgroup`` as read, version, directory) and
    its open descriptors: usage, oom counter, limits (this cgroup's and its ancestors')."""

    raw: bytes
    version: int
    directory: Optional[str]
    usage: Optional[int]
    oom: Optional[int]
    limits: Tuple[int, ...]

    def fds(self) -> Tuple[int, ...]:
        return tuple(fd for fd in (self.usage, self.oom) + self.limits if fd is not None)


def hand_over(parent: Any) -> Optional[CgroupFiles]:
    """On the parent's sampler, in the forked child: its cgroup files, which its
    ``abandon`` then no longer closes. None when it found none."""
    try:
        if parent._cg_raw is None:
            return None
        cg = CgroupFiles(parent._cg_raw, parent.cg_version, parent.cg_dir, parent._usage, parent._oom,
                         tuple(parent._limit_fds))
        handed = set(cg.fds())
        parent._fds = [fd for fd in parent._fds if fd not in handed]
        parent._usage = parent._oom = None
        parent._limit_fds = []
        return cg
    except Exception:
        return None


def adopt(sampler: Any, cg: CgroupFiles) -> bool:
    """Give ``sampler`` (the child's, being built) the files of ``cg`` when the child is in
    the same cgroup (True); else close them (False: the caller looks the cgroup up)."""
    try:
        with open("/proc/%d/cgroup" % sampler.pid, "rb") as f:
            raw = f.read()
    except OSError:
        raw = b""
    if not raw or raw != cg.raw:
        close(cg)
        return False
    sampler._cg_raw = raw
    sampler.cg_version, sampler.cg_dir = cg.version, cg.directory
    sampler._usage, sampler._oom, sampler._limit_fds = cg.usage, cg.oom, list(cg.limits)
    sampler._fds.extend(cg.fds())
    try:
        sampler.rec.set_meta(mem_cgroup=cg.directory, mem_cgroup_version=cg.version, mem_page_size=sampler.page)
    except Exception:
        pass
    return True


def close(cg: Optional[CgroupFiles]) -> None:
    """Close the descriptors of ``cg`` (not adopted)."""
    for fd in cg.fds() if cg is not None else ():
        try:
            os.close(fd)
        except OSError:
            pass
