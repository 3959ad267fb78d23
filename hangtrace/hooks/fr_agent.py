"""Flight Recorder capture inside a traced process (issue 10, item 2).

* ``configure_env()`` (call before torch is imported, e.g. from the bootstrap): sets
  ``TORCH_FR_BUFFER_SIZE=2000`` when the user set neither it nor its alias
  ``TORCH_NCCL_TRACE_BUFFER_SIZE``. torch 2.13 records 2000 entries by default already
  (checked here: a gloo job without the variable has entries); the variable keeps it on
  for torch versions whose default is 0 and documents our choice.
* ``start(run_dir)`` (call when torch.distributed is first used): a daemon thread
  ``hangtrace-fr-agent`` that blocks on a FIFO ``RUN_DIR/fr/<host>-<pid>.req``. A collector
  writes a request token into it (``tracer.collect.frrequest.request_fr_dumps``); the agent
  calls ``torch._C._distributed_c10d._dump_fr_trace(True, True, False)`` (and the NCCL dump
  where present) and writes ``<host>-<pid>.pkl`` atomically (tmp + rename), then
  ``<host>-<pid>.meta.json`` with rank, world size, host, pid and the token. The main thread
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
from typing import Callable, Optional

# json, socket, threading and time are imported when an agent starts: this module is
# imported at every traced start-up (``configure_env``), most processes never start one.

FR_SUBDIR = "fr"
ENV_BUFFER = "TORCH_FR_BUFFER_SIZE"
ENV_BUFFER_ALIAS = "TORCH_NCCL_TRACE_BUFFER_SIZE"
DEFAULT_ENTRIES = "2000"


def fr_dir(run_dir: str) -> str:
    """``RUN_DIR/fr``: where agents listen and write dumps."""
    return os.path.join(run_dir, FR_SUBDIR)


def fifo_path(run_dir: str, host: str, pid: int) -> str:
    """The request FIFO of process ``pid`` on ``host``."""
    return os.path.join(fr_dir(run_dir), "%s-%d.req" % (host, pid))


def dump_path(run_dir: str, host: str, pid: int) -> str:
    """The dump file (torch's pickle, as ``_dump_fr_trace`` returns it)."""
    return os.path.join(fr_dir(run_dir), "%s-%d.pkl" % (host, pid))


def meta_path(run_dir: str, host: str, pid: int) -> str:
    """The sidecar with identity and the request token answered."""
    return os.path.join(fr_dir(run_dir), "%s-%d.meta.json" % (host, pid))


def configure_env(environ: Optional[dict] = None) -> bool:
    """Turn the Flight Recorder on unless the user configured it. True when we set it."""
    env = os.environ if environ is None else environ
    if env.get("HANGTRACE_FR", "1") == "0" or ENV_BUFFER in env or ENV_BUFFER_ALIAS in env:
        return False
    env[ENV_BUFFER] = DEFAULT_ENTRIES
    return True


def _noop_log(msg: str, key: Optional[str] = None) -> None:
    return None


class _Agent:
    def __init__(self, run_dir: str, log: Callable[..., None]) -> None:
        self.run_dir = run_dir
        self.log = log
        import socket
        import threading
        self.pid = os.getpid()
        self.host = socket.gethostname()
        self.fifo = fifo_path(run_dir, self.host, self.pid)
        self.stopping = False
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self.run, name="hangtrace-fr-agent", daemon=True)

    def run(self) -> None:
        while not self.stopping:
            try:
                fd = os.open(self.fifo, os.O_RDONLY)  # blocks until a collector opens it
                try:
                    token = os.read(fd, 256).decode("ascii", "replace").strip()
                finally:
                    os.close(fd)
            except OSError as e:
                self.log("flight recorder agent stopped: %r" % (e,), "fr-agent")
                return
            if self.stopping:
                return
            if token:
                self.dump("request", token)

    def dump(self, reason: str, token: str = "") -> Optional[str]:
        with self.lock:
            try:
                return _write_dump(self.run_dir, self.host, self.pid, reason, token)
            except Exception as e:
                self.log("flight recorder dump failed: %r" % (e,), "fr-dump")
                return None

    def stop(self) -> None:
        self.stopping = True
        try:  # wake the thread blocked in open(): open the FIFO for writing, without blocking
            fd = os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK)
            os.close(fd)
        except OSError:
            pass
        try:
            os.unlink(self.fifo)
        except OSError:
            pass


_agent: Optional[_Agent] = None


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
    import time
    import torch  # the agent starts only once torch.distributed is in use
    c10d = torch._C._distributed_c10d
    fn = getattr(c10d, "_dump_fr_trace", None)
    if fn is None:
        return None
    data = fn(True, True, False)  # includeCollectives, includeStackTraces, onlyActive
    path = dump_path(run_dir, host, pid)
    _atomic_write(path, data)
    nccl = getattr(c10d, "_dump_nccl_trace", None)
    paths = [path]
    if nccl is not None:
        try:
            npath = os.path.join(fr_dir(run_dir), "%s-%d-nccl.pkl" % (host, pid))
            _atomic_write(npath, nccl(True, True, False))
            paths.append(npath)
        except Exception:
            pass  # no NCCL process group in this process
    meta = dict(_identity(), host=host, pid=pid, reason=reason, token=token, wall_ns=time.time_ns(),
                files=[os.path.basename(p) for p in paths])
    _atomic_write(meta_path(run_dir, host, pid), json.dumps(meta).encode())
    return path


def _atomic_write(path: str, data: bytes) -> None:
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def start(run_dir: str, log: Optional[Callable[..., None]] = None) -> bool:
    """Start this process's agent (idempotent; again in a forked child). Never raises.

    Returns True when an agent listens. Off when ``HANGTRACE_FR=0``.
    """
    global _agent
    try:
        if os.environ.get("HANGTRACE_FR", "1") == "0":
            return False
        if _agent is not None and _agent.pid == os.getpid() and _agent.thread.is_alive():
            return True
        a = _Agent(run_dir, log or _noop_log)
        os.makedirs(fr_dir(run_dir), mode=0o700, exist_ok=True)
        try:
            os.unlink(a.fifo)
        except OSError:
            pass
        os.mkfifo(a.fifo, 0o600)
        a.thread.start()
        _agent = a
        import atexit
        atexit.register(a.stop)
        return True
    except Exception as e:
        (log or _noop_log)("flight recorder agent not started: %r" % (e,), "fr-start")
        return False


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
