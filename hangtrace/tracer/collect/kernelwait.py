"""What the kernel says a blocked thread waits for: the system call, its file, its wait channel.

py-spy tells that a thread is idle in a system call (``active: false``) and in which Python
line; it does not tell which call or on what. The kernel does, for any thread we may
ptrace (the same permission py-spy needs):

- ``/proc/PID/task/TID/syscall``: the call's number and its six arguments (hex), or
  ``running`` (proc(5));
- ``/proc/PID/task/TID/wchan``: the kernel function it sleeps in (``wait_for_partner``
  is a FIFO open, ``pipe_read``, ``do_wait``, ``futex_wait_queue``; ``0`` when hidden);
- a path argument: the string at that address, read from ``/proc/PID/mem``;
- a file descriptor argument: ``/proc/PID/fd/N`` (a path, ``pipe:[inode]``,
  ``socket:[inode]``); a socket's addresses from psutil's ``net_connections``.

:func:`annotate` adds ``'kernel'`` to each py-spy thread that is not running::

    {'syscall': 'openat',               # name (syscalls.py's table), or 'syscall 435'
     'nr': 257,                         # the number as the kernel printed it
     'args': ["'/ckpt/shard1.pt'"],     # what the arguments name, at most 4
     'wchan': 'wait_for_partner'}       # absent when the kernel hides it

Impure (reads /proc); never raises: a thread that ends, a permission refused or an odd
value leaves that thread without ``'kernel'``. Cost: three small reads per idle thread
(plus one ``net_connections`` per process with a socket argument).
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping, Optional, Tuple

from hangtrace.tracer.collect.filelocks import held_locks, lock_holders
from hangtrace.tracer.collect.syscalls import RESTART, syscall_table

_MAX_PATH = 4096  # PATH_MAX
_MAX_POLL = 8  # pollfd entries described
_AT_FDCWD = -100


def _read(path: str) -> Optional[str]:
    try:
        with open(path, "r") as f:
            return f.read(4096).strip()
    except (OSError, ValueError):
        return None


def _mem(pid: int, addr: int, size: int) -> Optional[bytes]:
    try:
        with open("/proc/%d/mem" % pid, "rb", buffering=0) as f:
            f.seek(addr)
            return f.read(size)
    except (OSError, ValueError, OverflowError):
        return None


def _cstring(pid: int, addr: int) -> Optional[str]:
    if not addr:
        return None
    data = _mem(pid, addr, _MAX_PATH)
    if not data:
        return None
    return data.split(b"\0", 1)[0].decode("utf-8", "replace")


def _label(pid: int) -> str:
    """``'python3 job.py'``: the program and its first argument, base names; '?' when gone."""
    try:
        import psutil

        argv = psutil.Process(pid).cmdline()
    except Exception:
        return "?"
    words = [os.path.basename(a) for a in argv[:1]] + [
        os.path.basename(a) for a in argv[1:8] if not a.startswith("-")
    ][:1]
    return " ".join(words) or "?"


class _Fds:
    """What a process's file descriptors name; sockets described once per process."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._socks: Optional[Dict[int, str]] = None
        self._peers: Optional[Dict[Tuple[Any, Any], int]] = None

    def _sockets(self) -> Dict[int, str]:
        if self._socks is None:
            self._socks = {}
            try:
                import psutil

                for c in psutil.Process(self.pid).net_connections(kind="all"):
                    if c.fd is None or c.fd < 0:
                        continue
                    kind = {1: "TCP", 2: "UDP"}.get(int(c.type), "socket")
                    la, ra = c.laddr, c.raddr
                    if isinstance(la, str) or isinstance(ra, str):  # AF_UNIX: paths
                        desc = "unix %s%s" % (la or "(unnamed)", " -> %s" % ra if ra else "")
                    else:
                        desc = "%s %s%s%s%s" % (
                            kind,
                            "%s:%s" % tuple(la) if la else "?",
                            " -> %s:%s" % tuple(ra) if ra else "",
                            ", %s" % c.status if c.status and c.status != "NONE" else "",
                            self._peer(kind, la, ra),
                        )
                    self._socks[int(c.fd)] = desc
            except Exception:  # psutil missing, process gone, permission: the fd link only
                pass
        return self._socks

    def _peer(self, kind: str, la: Any, ra: Any) -> str:
        """``', peer pid 812 (python3 server.py)'`` when the other end of a TCP connection
        is a socket of a process on this host (found by its address in the host's TCP
        table: psutil ``net_connections``, which needs root for other users' processes);
        ``', peer: this process'`` for one of its own threads; else ''."""
        if kind != "TCP" or not ra or not la:
            return ""
        if self._peers is None:
            self._peers = {}
            for _attempt in range(2):  # (a process that exits during the scan can fail it)
                try:
                    import psutil

                    for c in psutil.net_connections(kind="tcp"):
                        if c.laddr and c.raddr and c.pid:
                            self._peers[(tuple(c.laddr), tuple(c.raddr))] = int(c.pid)
                    break
                except Exception:  # permission, psutil missing: no peer named
                    continue
        pid = self._peers.get((tuple(ra), tuple(la)))
        if pid is None:
            return ""
        if pid == self.pid:
            return ", peer: this process"
        return ", peer pid %d (%s)" % (pid, _label(pid))

    def name(self, fd: int, lock: bool = False) -> str:
        """``'fd 4 (TCP 127.0.0.1:5 -> 127.0.0.1:9, ESTABLISHED)'``, ``'fd 3 (/x/y.pt)'``;
        with ``lock`` (the fd of a blocked ``flock``/``fcntl``), who holds a lock on that file:
        ``'fd 3 (/data/.lock, held by pid 812 (python3 job.py))'``."""
        try:
            target = os.readlink("/proc/%d/fd/%d" % (self.pid, fd))
        except OSError:
            return "fd %d" % fd
        if target.startswith("socket:"):
            target = self._sockets().get(fd, target)
        if lock:
            holders = lock_holders("/proc/%d/fd/%d" % (self.pid, fd), self.pid)
            if holders:
                target += ", held by %s" % ", ".join("pid %d (%s)" % (h, _label(h)) for h in holders[:3])
        return "fd %d (%s)" % (fd, target)


def _poll_fds(pid: int, addr: int, count: int, fds: _Fds) -> List[str]:
    n = max(0, min(count, _MAX_POLL))
    data = _mem(pid, addr, 8 * n) if addr and n else None
    out = []
    for i in range(len(data or b"") // 8):
        fd = int.from_bytes(data[8 * i : 8 * i + 4], "little", signed=True)  # type: ignore[index]
        if fd >= 0:
            out.append(fds.name(fd))
    if count > n:
        out.append("%d more" % (count - n))
    return out


def decode(
    pid: int, text: str, fds: Optional[_Fds] = None, table: Optional[Mapping[int, Tuple[str, str]]] = None
) -> Optional[Dict[str, Any]]:
    """One ``/proc/PID/task/TID/syscall`` line -> ``{'syscall', 'nr', 'args'}``, or None
    when the thread is running or the line is not a blocked call (``-1 ...``: in the
    kernel, not in a call)."""
    parts = (text or "").split()
    if not parts or parts[0] in ("running", "-1"):
        return None
    try:
        nr = int(parts[0])
        vals = [int(x, 16) for x in parts[1:7]]
    except ValueError:
        return None
    name, spec = (table if table is not None else syscall_table()).get(nr, ("syscall %d" % nr, ""))
    fds = fds or _Fds(pid)
    args: List[str] = []
    for i, kind in enumerate(spec[: len(vals)]):
        v = vals[i]
        sv = v - (1 << 64) if v >= 1 << 63 else v  # an int argument read as unsigned
        if kind == "f" and 0 <= sv < 1 << 31:
            args.append(fds.name(sv, lock=name in ("flock", "fcntl")))
        elif (
            kind == "d"
            and sv != _AT_FDCWD
            and (sv & 0xFFFFFFFF) != (_AT_FDCWD & 0xFFFFFFFF)
            and 0 <= sv < 1 << 31
        ):
            args.append(fds.name(sv))
        elif kind == "p":
            s = _cstring(pid, v)
            if s is not None:
                args.append(repr(s))
        elif kind == "P" and i + 1 < len(vals):
            args.extend(_poll_fds(pid, v, vals[i + 1], fds))
        elif kind == "w":
            args.append("any child" if sv == -1 else "pid %d" % sv if sv > 0 else "its process group")
    return {"syscall": name, "nr": nr, "args": args[: _MAX_POLL + 1]}


def read_syscalls(pid: int) -> Dict[int, str]:
    """``{tid: /proc/PID/task/TID/syscall line}`` for every thread of ``pid`` now: taken
    before py-spy's ptrace stop, which interrupts a blocked call and leaves the thread in
    ``restart_syscall`` (its arguments gone) when it is read after. Reading the file does
    not interrupt the call. Never raises ({} when the process is gone or unreadable)."""
    out: Dict[int, str] = {}
    try:
        tids = os.listdir("/proc/%d/task" % int(pid))
    except OSError:
        return out
    for t in tids:
        text = _read("/proc/%d/task/%s/syscall" % (int(pid), t))
        if text and t.isdigit():
            out[int(t)] = text
    return out


def thread_wait(
    pid: int, tid: int, fds: Optional[_Fds] = None, before: Optional[Mapping[int, str]] = None
) -> Optional[Dict[str, Any]]:
    """The kernel's view of thread ``tid`` of ``pid`` (module docstring), or None.
    ``before``: :func:`read_syscalls` taken earlier; its line is used when the call read
    now is a ``restart_syscall`` (or the thread is in no call now but was blocked then,
    which a debugger's stop can also cause)."""
    base = "/proc/%d/task/%d/" % (int(pid), int(tid))
    now = _read(base + "syscall") or ""
    k = decode(pid, now, fds)
    earlier = (before or {}).get(int(tid))
    if earlier and (k is None or k["syscall"] == RESTART):
        k = decode(pid, earlier, fds) or k
    if k is None:
        return None
    wchan = _read(base + "wchan")
    if wchan and wchan != "0":
        k["wchan"] = wchan
    return k


def annotate(
    pid: int, threads: List[Dict[str, Any]], before: Optional[Mapping[int, str]] = None
) -> List[Dict[str, Any]]:
    """``threads`` (py-spy's, normalised) with ``'kernel'`` added to each one that is not
    running and has an ``os_thread_id``; the same list, changed in place. ``before``:
    :func:`read_syscalls` taken before py-spy ran (see :func:`thread_wait`). Never raises."""
    try:
        fds = _Fds(pid)
        for t in threads:
            tid = t.get("os_thread_id")
            if t.get("active") is False and isinstance(tid, int) and tid > 0:
                k = thread_wait(pid, tid, fds, before)
                if k is not None:
                    t["kernel"] = k
        held = held_locks(pid)
        main = next((t for t in threads if t.get("os_thread_id") == pid), None)
        if held and main is not None:  # (a lock belongs to the process; its main thread carries the fact)
            main["held_locks"] = held
    except Exception:  # never lose the stacks for a detail
        pass
    return threads


def children(pid: int, limit: int = 16) -> List[Dict[str, Any]]:
    """The live child processes of ``pid``, traced or not: ``[{'pid', 'argv', 'state'
    (ps's letter: 'S' sleeping, 'D' uninterruptible, ...), 'kernel' (the main thread's
    wait, as :func:`thread_wait`; absent when running or unreadable)}]``, at most
    ``limit``, oldest first. Never raises (psutil missing or the process gone: [])."""
    out: List[Dict[str, Any]] = []
    try:
        import psutil

        kids = psutil.Process(int(pid)).children()
    except Exception:
        return out
    for c in sorted(kids, key=lambda c: c.pid)[: max(0, limit)]:
        try:
            item: Dict[str, Any] = {"pid": c.pid, "argv": [str(a) for a in c.cmdline()][:32]}
            stat = _read("/proc/%d/stat" % c.pid) or ""
            item["state"] = stat[stat.rfind(")") + 2 : stat.rfind(")") + 3] if ")" in stat else ""
            k = thread_wait(c.pid, c.pid)
            if k is not None:
                item["kernel"] = k
            out.append(item)
        except Exception:  # it exited meanwhile, or we may not read it
            continue
    return out
