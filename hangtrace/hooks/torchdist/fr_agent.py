"""Flight Recorder capture inside a traced process (issue 10, item 2).

* ``configure_env()`` (= ``config.configure_fr_env``, called by the bootstrap before torch
  is imported): sets ``TORCH_FR_BUFFER_SIZE=2000`` when the user set neither it nor its
  alias ``TORCH_NCCL_TRACE_BUFFER_SIZE``. torch 2.13 records 2000 entries by default already
  (checked here: a gloo job without the variable has entries); the variable keeps it on
  for torch versions whose default is 0 and documents our choice.
* ``start(run_dir)`` (called when this process joins a process group): a daemon thread
  ``hangtrace-fr-agent`` that waits in ``accept`` on a Unix socket in the abstract namespace
  (``socket_name``: no file anywhere, nothing left behind by a killed process, nothing that
  blocks a ``grep -r`` or a copy of the run directory, as a FIFO would). A collector
  connects and sends a request token (``tracer.collect.frrequest.request_fr_dumps``); the
  agent calls ``torch._C._distributed_c10d._dump_fr_trace(True, False, False)`` (and the NCCL dump
  where present) and writes ``<host>-<pid>.pkl`` atomically (tmp + rename), then
  ``<host>-<pid>.meta.json`` with rank, world size, host, pid and the token, and answers
  ``done`` on the connection. An abstract socket has no file permissions, so the agent
  answers only a peer of this process's user or root (``SO_PEERCRED``; others get
  ``refused``), and writes at most one dump a second (a request within a second of the
  last dump is answered by that dump). Abstract sockets are per network namespace: the collector
  must run in the job's (the node watcher, started by the job, does). The main thread
  is not needed: torch's dump functions read the recorder's own buffer under its own lock,
  and the main thread blocked inside a gloo collective has released the GIL (checked here:
  tests/integration/test_fr_live.py dumps from ranks blocked in a collective).
* ``dump_now(reason)``: the same dump from any thread; never raises.

SIGTERM: not dumped from a signal handler. A Python handler runs only when the main thread
returns to bytecode, which a rank blocked in a collective never does; ``signal.set_wakeup_fd``
would wake our thread at once, but there is one wakeup fd per process and asyncio loops
take it. A collector that is about to stop a job should call ``request_fr_dumps`` first.

Nothing here raises into the user's program; failures are logged once through ``log``.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional

from hangtrace.tracer import config

# json, socket, threading and time are imported when an agent starts: this module is
# imported when a process joins a process group (``torch_groups``), not at start-up; the
# Flight Recorder's variable is set at start-up by ``config.configure_fr_env``.

FR_SUBDIR = "fr"
ENV_BUFFER = config.FR_BUFFER_ENV
ENV_BUFFER_ALIAS = config.FR_BUFFER_ENV_ALIAS
DEFAULT_ENTRIES = config.FR_DEFAULT_ENTRIES


def fr_dir(run_dir: str) -> str:
    """``RUN_DIR/fr``: where agents listen and write dumps."""
    return os.path.join(run_dir, FR_SUBDIR)


def socket_name(run_dir: str, pid: int) -> bytes:
    """The abstract Unix socket address of process ``pid``'s agent for ``run_dir``
    (leading NUL: Linux abstract namespace, unix(7)); the run directory's CRC-32 keeps two
    runs' processes apart."""
    import zlib

    rd = os.path.abspath(run_dir).encode("utf-8", "surrogateescape")
    return b"\0hangtrace-fr-%d-%08x" % (pid, zlib.crc32(rd))


def dump_path(run_dir: str, host: str, pid: int) -> str:
    """The dump file (torch's pickle, as ``_dump_fr_trace`` returns it)."""
    return os.path.join(fr_dir(run_dir), "%s-%d.pkl" % (host, pid))


def meta_path(run_dir: str, host: str, pid: int) -> str:
    """The sidecar with identity and the request token answered."""
    return os.path.join(fr_dir(run_dir), "%s-%d.meta.json" % (host, pid))


def tasks_path(run_dir: str, host: str, pid: int) -> str:
    """``RUN_DIR/fr/<host>-<pid>.tasks.json``: the pending asyncio tasks of this process's
    running loops at the last request (``hooks/process/asyncio_tasks.py``)."""
    return os.path.join(fr_dir(run_dir), "%s-%d.tasks.json" % (host, pid))


configure_env = config.configure_fr_env  # (the name it had here)


def _noop_log(msg: str, key: Optional[str] = None) -> None:
    return None


class _Agent:
    def __init__(self, run_dir: str, log: Callable[..., None]) -> None:
        import socket
        import threading

        self.run_dir = run_dir
        self.log = log
        self.pid = os.getpid()
        self.host = socket.gethostname()
        self.stopping = False
        self.lock = threading.Lock()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # close-on-exec (PEP 446)
        self.sock.bind(socket_name(run_dir, self.pid))  # OSError EADDRINUSE: another agent has it
        self.sock.listen(16)
        self.thread = threading.Thread(target=self.run, name="hangtrace-fr-agent", daemon=True)
        self.last_dump_s = float("-inf")  # time.monotonic() of the last dump written
        self.last_path: Optional[str] = None

    def run(self) -> None:
        while not self.stopping:
            try:
                conn, _ = self.sock.accept()
            except OSError as e:
                if not self.stopping:
                    self.log("flight recorder agent stopped: %r" % (e,), "fr-agent")
                return
            try:
                conn.settimeout(2.0)
                if not _peer_is_owner(conn):
                    self.log("flight recorder agent refused a request from another user", "fr-refused")
                    conn.recv(256)  # take the request first: a peer still writing gets an answer, not EPIPE
                    conn.sendall(b"refused\n")
                    continue
                token = conn.recv(256).decode("ascii", "replace").strip()
                if token == PROGRESS and not self.stopping:
                    conn.sendall(("%s %s\n" % (PROGRESS, progress_line())).encode())
                elif token and not self.stopping:
                    self.dump("request", token)
                    conn.sendall(b"done\n")
            except OSError:
                pass
            finally:
                conn.close()

    def dump(self, reason: str, token: str = "") -> Optional[str]:
        import time

        with self.lock:
            try:
                now = time.monotonic()
                if (
                    token
                    and now - self.last_dump_s < MIN_DUMP_INTERVAL_S
                    and _retoken(self.run_dir, self.host, self.pid, token)
                ):
                    return self.last_path  # answered by the dump of less than a second ago
                from hangtrace.hooks.process import asyncio_tasks

                asyncio_tasks.write(tasks_path(self.run_dir, self.host, self.pid))  # before the sidecar
                self.last_path = _write_dump(self.run_dir, self.host, self.pid, reason, token)
                self.last_dump_s = time.monotonic()
                return self.last_path
            except Exception as e:
                self.log("flight recorder dump failed: %r" % (e,), "fr-dump")
                return None

    def stop(self) -> None:
        """Stop listening; wakes the thread blocked in ``accept`` (``shutdown``: on Linux
        it returns EINVAL there). Never raises."""
        self.stopping = True
        for fn in (lambda: self.sock.shutdown(2), self.sock.close):
            try:
                fn()
            except OSError:
                pass


_agent: Optional[_Agent] = None

#: A request within this many seconds of the last dump is answered by that dump (its meta
#: file takes the new token): a flood of requests costs the training process one dump a second.
MIN_DUMP_INTERVAL_S = 1.0


def _peer_is_owner(conn: Any) -> bool:
    """True when the process at the other end of ``conn`` runs as this process's effective
    user or as root. An abstract Unix socket has no file permissions: any local user can
    connect, so the agent asks the kernel who connected (``SO_PEERCRED``: the peer's pid,
    uid and gid at ``connect`` time, socket(7) and unix(7)). False when the kernel does not
    say."""
    import socket
    import struct

    try:
        raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", raw)
    except (OSError, AttributeError, struct.error):
        return False
    return uid == 0 or uid == os.geteuid()


def _retoken(run_dir: str, host: str, pid: int, token: str) -> bool:
    """Give the newest dump's meta file the requester's ``token`` (atomically), so that a
    request answered by that dump is seen as answered. False when there is no meta file to
    take it (then the caller dumps)."""
    import json

    path = meta_path(run_dir, host, pid)
    try:
        with open(path, "rb") as f:
            meta = json.loads(f.read())
        meta["token"] = token
        _atomic_write(path, json.dumps(meta).encode())
        return True
    except (OSError, ValueError, TypeError):
        return False


#: The request the node watcher sends every poll: the answer is ``progress_line()``, no
#: file is written.
PROGRESS = "progress"


def progress_line() -> str:
    """Per process group, torch's own counters of collectives enqueued and completed
    (``_dump_fr_trace_json(includeCollectives=False)``: ``pg_status``; 228 bytes and 11 µs
    on a gloo rank here, no entries): ``"<pg>:<enqueued>:<completed>;..."`` sorted by
    group, or "" when torch has no such dump. Counts C++-issued collectives too (DDP's
    reducer, FSDP), which the rings never see. Never raises."""
    try:
        import json
        import sys

        torch = sys.modules.get("torch")  # (an actor's agent: never import torch for it)
        if torch is None:
            return ""
        fn = getattr(torch._C._distributed_c10d, "_dump_fr_trace_json", None)
        if fn is None:
            return ""
        st = json.loads(fn(False, False)).get("pg_status") or {}
        return ";".join(
            "%s:%s:%s" % (g, v.get("last_enqueued_collective"), v.get("last_completed_collective"))
            for g, v in sorted(st.items())
            if isinstance(v, dict)
        )
    except Exception:
        return ""


def _identity() -> dict:
    out = {"rank": -1, "world_size": -1, "local_rank": int(os.environ.get("LOCAL_RANK", "-1") or -1)}
    import sys

    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_initialized():
            out["rank"], out["world_size"] = dist.get_rank(), dist.get_world_size()
    except Exception:
        pass
    return out


def _write_dump(run_dir: str, host: str, pid: int, reason: str, token: str) -> Optional[str]:
    """Dump now; returns the dump's path, or None when torch has no Flight Recorder."""
    import json
    import sys
    import time

    paths: list = []
    dist = sys.modules.get("torch.distributed")  # a Ray actor's agent runs before (or without) any group
    joined = False
    try:
        joined = dist is not None and bool(dist.is_initialized())
    except Exception:
        pass
    if not joined:  # the sidecar alone: the collector's token says this agent answered (its tasks file)
        _atomic_write(
            meta_path(run_dir, host, pid),
            json.dumps(
                dict(
                    _identity(),
                    host=host,
                    pid=pid,
                    reason=reason,
                    token=token,
                    wall_ns=time.time_ns(),
                    files=[],
                )
            ).encode(),
        )
        return None
    import torch

    c10d = torch._C._distributed_c10d
    fn = getattr(c10d, "_dump_fr_trace", None)
    if fn is None:
        return None
    # includeCollectives, includeStackTraces, onlyActive. No stack traces: torch symbolizes
    # them in Python, and the first such dump imported 829 modules (torch._dynamo, sympy...)
    # and took 1.05 s here (torch 2.13, a gloo rank): side effects in the user's process
    # while it hangs. The rank's own stacks come from py-spy.
    data = fn(True, False, False)
    path = dump_path(run_dir, host, pid)
    _atomic_write(path, data)
    nccl = getattr(c10d, "_dump_nccl_trace", None)
    paths.append(path)
    if nccl is not None:
        try:
            npath = os.path.join(fr_dir(run_dir), "%s-%d-nccl.pkl" % (host, pid))
            _atomic_write(npath, nccl(True, False, False))
            paths.append(npath)
        except Exception:
            pass  # no NCCL process group in this process
    meta = dict(
        _identity(),
        host=host,
        pid=pid,
        reason=reason,
        token=token,
        wall_ns=time.time_ns(),
        files=[os.path.basename(p) for p in paths],
    )
    _atomic_write(meta_path(run_dir, host, pid), json.dumps(meta).encode())
    return path


def _atomic_write(path: str, data: bytes) -> None:
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def start(run_dir: str, log: Optional[Callable[..., None]] = None) -> bool:
    """Start this process's agent (idempotent; again in a forked child that joins a group
    of its own). Never raises. Returns True when an agent listens. Off when
    ``HANGTRACE_FR=0``. Called when the process joins a process group, and by a Ray
    actor at its first method (``ray_hooks``): an actor answers snapshot requests with its
    pending asyncio tasks (an async actor's methods are tasks of its event loop, whose
    thread py-spy sees idle in ``epoll_wait``), and a Flight Recorder dump once it joined
    a group (torch is never imported for it)."""
    global _agent
    try:
        if os.environ.get(config.FR, "1") == "0":
            return False
        if _agent is not None and _agent.pid == os.getpid() and _agent.thread.is_alive():
            return True
        os.makedirs(fr_dir(run_dir), mode=0o700, exist_ok=True)
        a = _Agent(run_dir, log or _noop_log)
        a.thread.start()
        if _agent is None:
            import atexit

            atexit.register(stop)
            os.register_at_fork(after_in_child=_forget_in_child)
        _agent = a
        return True
    except Exception as e:
        (log or _noop_log)("flight recorder agent not started: %r" % (e,), "fr-start")
        return False


def _forget_in_child() -> None:
    """A forked child has the parent's listening socket but not its thread: close our
    copy, so that requests reach the parent's agent only."""
    global _agent
    a = _agent
    if a is not None and a.pid != os.getpid():
        try:
            a.sock.close()
        except OSError:
            pass
        _agent = None


def dump_now(reason: str = "request") -> Optional[str]:
    """Dump this process's Flight Recorder into the run directory now (any thread).

    Returns the path written, None when no agent was started or the dump failed.
    """
    a = _agent
    if a is None or a.pid != os.getpid():
        return None
    return a.dump(reason)


def stop() -> None:
    """Stop the agent and remove its FIFO (also registered with atexit)."""
    global _agent
    if _agent is not None:
        _agent.stop()
        _agent = None
