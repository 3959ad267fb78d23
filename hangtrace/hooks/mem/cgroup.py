"""The memory cgroup of a process (v1 and v2): discovery and file parsing, for the
memory sampler (hooks/mem/memory.py) and the collector. Pure functions on file contents
(unit-tested), ``find_cgroup``, which reads /proc, and ``CgroupFiles``, the sampler's
open cgroup files. Standard library only.

Sources: ``/proc/PID/cgroup`` (proc(5)), ``/proc/PID/mountinfo``; cgroup v1
``memory.usage_in_bytes``/``memory.limit_in_bytes``/``memory.oom_control``, v2
``memory.current``/``memory.max``/``memory.events`` (kernel cgroup-v1/memory.rst and
cgroup-v2.rst).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

NO_LIMIT = 1 << 60  # limits at or above this are "no limit" (v1 reports 2**63 - 4096)


def parse_proc_cgroup(text: str) -> Tuple[Optional[str], Optional[str]]:
    """``/proc/PID/cgroup`` text -> ``(v1 memory path or None, v2 path or None)``."""
    v1 = v2 = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, ctrls, path = parts
        if hid == "0" and ctrls == "":
            v2 = path
        elif "memory" in ctrls.split(","):
            v1 = path
    return v1, v2


def parse_mountinfo(text: str) -> Dict[str, Optional[Tuple[str, str]]]:
    """``/proc/PID/mountinfo`` -> ``{'v1': (root, mountpoint) or None, 'v2': ... }``."""
    out: Dict[str, Optional[Tuple[str, str]]] = {"v1": None, "v2": None}
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        f = left.split()
        r = right.split()
        if len(f) < 5 or len(r) < 1:
            continue
        fstype = r[0]
        supers = r[2].split(",") if len(r) > 2 else []
        root, mnt = f[3], f[4].replace("\\040", " ")
        if fstype == "cgroup" and "memory" in supers and out["v1"] is None:
            out["v1"] = (root, mnt)
        elif fstype == "cgroup2" and out["v2"] is None:
            out["v2"] = (root, mnt)
    return out


def _join(root: str, mnt: str, path: str) -> str:
    if root != "/" and (path == root or path.startswith(root + "/")):
        path = path[len(root) :]
    return os.path.normpath(mnt + "/" + path.lstrip("/"))


def cgroup_candidates(cgroup_text: str, mountinfo_text: str) -> List[Tuple[int, str]]:
    """Directories that may hold this process's memory cgroup files, best first:
    ``[(version, dir), ...]`` (v1 memory controller first: on hybrid hosts it is the one
    that limits; then v2). The caller keeps the first whose files exist."""
    v1, v2 = parse_proc_cgroup(cgroup_text)
    mi = parse_mountinfo(mountinfo_text)
    out = []
    if v1 is not None:
        root, mnt = mi["v1"] or ("/", "/sys/fs/cgroup/memory")
        out.append((1, _join(root, mnt, v1)))
        out.append((1, mnt))  # inside a cgroup namespace the mount root is our cgroup
    if v2 is not None:
        root, mnt = mi["v2"] or ("/", "/sys/fs/cgroup")
        out.append((2, _join(root, mnt, v2)))
        out.append((2, mnt))
    return out


V1_FILES = ("memory.usage_in_bytes", "memory.limit_in_bytes", "memory.oom_control")
V2_FILES = ("memory.current", "memory.max", "memory.events")


def find_cgroup(pid: Optional[int] = None) -> Tuple[int, Optional[str]]:
    """``(version, dir)`` of the memory cgroup of ``pid`` (default: this process), or
    ``(0, None)`` when no memory controller is readable."""
    pid = os.getpid() if pid is None else pid
    try:
        with open("/proc/%d/cgroup" % pid) as f:
            cg = f.read()
        try:
            with open("/proc/%d/mountinfo" % pid) as f:
                mi = f.read()
        except OSError:
            mi = ""
    except OSError:
        return 0, None
    for ver, d in cgroup_candidates(cg, mi):
        files = V1_FILES if ver == 1 else V2_FILES
        if os.path.exists(os.path.join(d, files[0])):
            return ver, d
    return 0, None


def parse_limit(raw: Union[str, bytes]) -> int:
    """A limit file's content -> bytes, 0 for none ('max', or >= 2**60)."""
    raw = raw.strip()
    if not raw or raw == b"max" or raw == "max":
        return 0
    v = int(raw)
    return 0 if v >= NO_LIMIT else v


def parse_oom_kill(raw: Union[str, bytes]) -> int:
    """``oom_kill N`` from memory.oom_control (v1) or memory.events (v2) -> N, -1 if absent."""
    if isinstance(raw, bytes):
        i = raw.find(b"\noom_kill ")  # fast path (every sample): never the first line
        if i >= 0:
            j = raw.find(b"\n", i + 10)
            try:
                return int(raw[i + 10 : j if j > 0 else len(raw)])
            except ValueError:
                pass
        raw = raw.decode("ascii", "replace")
    for line in raw.splitlines():
        k, _, v = line.partition(" ")
        if k == "oom_kill":
            try:
                return int(v)
            except ValueError:
                return -1
    return -1


class CgroupFiles:
    """Mixin of ``sampler.Sampler``: its descriptors of ``/proc`` and memory cgroup files
    (usage, oom counter, the limits of the cgroup and its ancestors), reopened when the
    process moves to another cgroup. Uses the sampler's ``pid``, ``log``, ``rec``, ``page``."""

    pid: int
    page: int
    rec: Any
    log: Callable[..., None]
    _fds: List[int]
    _cg_raw: Optional[bytes]
    _usage: Optional[int]
    _oom: Optional[int]
    _statm: Optional[int]
    _host: int
    swap: int
    limit: int
    _limit_fds: List[int]
    cg_version: int
    cg_dir: Optional[str]

    def _open(self, path: str) -> Optional[int]:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        self._fds.append(fd)
        return fd

    def _close_cgroup(self) -> None:
        for fd in [self._usage, self._oom] + self._limit_fds:
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
                if fd in self._fds:
                    self._fds.remove(fd)
        self._usage = self._oom = None
        self._limit_fds = []

    def _check_cgroup(self) -> None:
        """(Re)open the cgroup files when ``/proc/PID/cgroup`` changed (a launcher or Ray
        may move the process after it started)."""
        try:
            with open("/proc/%d/cgroup" % self.pid, "rb") as f:
                raw = f.read()
        except OSError:
            raw = b""
        if raw == self._cg_raw:
            return
        self._cg_raw = raw
        self._close_cgroup()
        ver, d = find_cgroup(self.pid)
        self.cg_version, self.cg_dir = ver, d
        if d is None:
            self.log(
                "memory: no readable memory cgroup for pid %d; cgroup figures are -1" % self.pid, "mem-nocg"
            )
        else:
            files = V1_FILES if ver == 1 else V2_FILES
            self._usage = self._open(os.path.join(d, files[0]))
            self._oom = self._open(os.path.join(d, files[2]))
            # the effective limit is the smallest over the cgroup and its ancestors
            cur = d
            for _ in range(16):
                fd = self._open(os.path.join(cur, files[1]))
                if fd is None:
                    break
                self._limit_fds.append(fd)
                parent = os.path.dirname(cur)
                if parent == cur or not parent.startswith("/sys/fs/cgroup/"):
                    break
                cur = parent
        try:
            self.rec.set_meta(mem_cgroup=d, mem_cgroup_version=ver, mem_page_size=self.page)
        except Exception:
            pass

    def _sample_host(self, rec: Any, source: int) -> None:
        """One host sample written with ``rec.memory`` (the Python recorder's path; the C
        Ring reads the same descriptors in ``Ring.mem_host``). Raises nothing it can read."""
        try:  # (_statm None, unreadable: the TypeError gives -1, no check per sample)
            rss = int(os.pread(self._statm, 64, 0).split(None, 2)[1]) * self.page  # type: ignore[arg-type]
        except (OSError, TypeError, ValueError, IndexError):
            rss = -1
        usage = oom = -1
        if self._usage is not None:
            try:
                usage = int(os.pread(self._usage, 64, 0))
            except (OSError, ValueError):
                pass
        if self._oom is not None:
            try:
                oom = parse_oom_kill(os.pread(self._oom, 512, 0))
            except OSError:
                pass
        rec.memory(source, self._host, rss, self.swap, usage, self.limit, oom)
