"""Bounded-time key/value access for the node watchers' meeting (issue 39).

:class:`StoreLink`: a client of the job's own torch.distributed ``TCPStore`` (the store
behind ``MASTER_ADDR:MASTER_PORT`` or the c10d rendezvous endpoint; its server thread keeps
answering while the ranks' Python is stuck), connected with
``TCPStore(host, port, is_master=False, timeout=..., wait_for_workers=False)``; a ``get`` is
asked only after ``check`` found the key (a missing key would block until the timeout). torch's
timeout does not bound an operation on a store whose host stopped answering without closing
the connection (measured with torch 2.13: ``check``, ``add`` and a new client's connection to
a SIGSTOPped store's server still blocked after 15 s): every operation, the connection
included, runs in the link's own daemon thread and is given up after the timeout
(``HANGTRACE_STORE_TIMEOUT_S``, plus 1 s); the link is then broken for good (its client is in
an unknown state) and every later operation raises at once.
:class:`DirLink`: the same four operations over files in a shared directory
(``HANGTRACE_SHARED_DIR``; written whole and renamed into place, never memory-mapped; the
counter under ``fcntl.lockf``). Both raise :class:`StoreGone` when the other side cannot be
reached; nothing here blocks longer than the timeout.

torch is imported only here, only in a watcher of a multi-node job (about 1-2 s of start-up,
paid in the meeting's own thread: the stall and death detection never waits for it).
"""

from __future__ import annotations

import os
import queue
import threading
from typing import Any, Callable, Optional, Tuple


class StoreGone(Exception):
    """The store (or shared directory) cannot be reached; the message says why."""


class _Worker:
    """One daemon thread running calls for a link; :meth:`call` waits at most ``timeout_s``."""

    def __init__(self) -> None:
        self._q: "queue.Queue[Tuple[Callable[[], Any], list, threading.Event]]" = queue.Queue()
        threading.Thread(target=self._run, name="hangtrace-storelink", daemon=True).start()

    def _run(self) -> None:
        while True:
            fn, out, done = self._q.get()
            try:
                out.append((True, fn()))
            except BaseException as e:  # handed to the caller
                out.append((False, e))
            done.set()

    def call(self, fn: Callable[[], Any], timeout_s: float) -> Any:
        """``fn()``'s value; raises what it raised, or TimeoutError after ``timeout_s`` s."""
        out: list = []
        done = threading.Event()
        self._q.put((fn, out, done))
        if not done.wait(timeout_s):
            raise TimeoutError("no answer within %.0f s" % timeout_s)
        ok, v = out[0]
        if not ok:
            raise v
        return v


class StoreLink:
    """The job's TCPStore as a client; ``timeout_s`` bounds every operation (seconds)."""

    def __init__(self, host: str, port: int, timeout_s: float = 5.0) -> None:
        import datetime

        self.where = "the job's store at %s:%d" % (host, port)
        self.bytes_out = self.bytes_in = 0
        self.ops = 0  # operations sent (connection not counted)
        self.timeout_s = timeout_s
        self.broken: Optional[str] = None
        self._w = _Worker()
        # torch's C++ log prints a stack trace (WARNING, ERROR) for every failed operation on a store that
        # went away (measured: "sendBytes failed ... Broken pipe"); we say it in one line
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")

        try:  # (seconds of import on a loaded machine: not counted against the store's timeout)
            import torch.distributed as dist
        except Exception as e:
            raise StoreGone("cannot connect to %s: %s" % (self.where, _first_line(e))) from None

        def connect() -> Any:
            return dist.TCPStore(
                host,
                int(port),
                is_master=False,
                timeout=datetime.timedelta(seconds=timeout_s),
                wait_for_workers=False,
            )

        try:
            self._s: Any = self._w.call(connect, timeout_s + 1.0)
        except Exception as e:
            self.broken = "cannot connect to %s: %s" % (self.where, _first_line(e))
            raise StoreGone(self.broken) from None

    def _op(self, what: str, fn: Any, *args: Any) -> Any:
        if self.broken:
            raise StoreGone(self.broken)
        self.ops += 1
        try:
            return self._w.call(lambda: fn(*args), self.timeout_s + 1.0)
        except TimeoutError as e:
            self.broken = "%s failed on %s: %s (its host stopped answering)" % (what, self.where, e)
            raise StoreGone(self.broken) from None
        except Exception as e:
            raise StoreGone("%s failed on %s: %s" % (what, self.where, _first_line(e))) from None

    def set(self, key: str, value: bytes) -> None:
        self.bytes_out += len(value) + len(key)
        self._op("set", self._s.set, key, value)

    def check(self, key: str) -> bool:
        return bool(self._op("check", self._s.check, [key]))

    def get(self, key: str) -> Optional[bytes]:
        """The value of ``key``, None when it is not set (never waits for it)."""
        if not self.check(key):
            return None
        v = self._op("get", self._s.get, key)
        self.bytes_in += len(v) + len(key)
        return bytes(v)

    def add(self, key: str, n: int) -> int:
        return int(self._op("add", self._s.add, key, n))

    def multi_get(self, keys: "list[str]") -> "list[bytes]":
        """The values of ``keys``, every one of which is set (one round trip)."""
        vs = [bytes(v) for v in self._op("multi_get", self._s.multi_get, keys)]
        self.bytes_in += sum(len(v) for v in vs) + sum(len(k) for k in keys)
        return vs


class DirLink:
    """:class:`StoreLink`'s operations over files under ``root`` (a shared directory)."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.where = "the shared directory %s" % root
        self.bytes_out = self.bytes_in = 0
        try:
            os.makedirs(root, exist_ok=True)
        except OSError as e:
            raise StoreGone("cannot use %s: %s" % (self.where, e.strerror or e)) from None

    def _path(self, key: str) -> str:
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in key.replace("/", "~"))
        return os.path.join(self.root, safe)

    def set(self, key: str, value: bytes) -> None:
        p = self._path(key)
        tmp = "%s.%d.tmp" % (p, os.getpid())
        try:
            with open(tmp, "wb") as f:
                f.write(value)
            os.replace(tmp, p)
        except OSError as e:
            raise StoreGone("cannot write %s: %s" % (p, e.strerror or e)) from None
        self.bytes_out += len(value)

    def check(self, key: str) -> bool:
        return os.path.exists(self._path(key))

    def get(self, key: str) -> Optional[bytes]:
        try:
            with open(self._path(key), "rb") as f:
                v = f.read()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise StoreGone("cannot read %s: %s" % (self._path(key), e.strerror or e)) from None
        self.bytes_in += len(v)
        return v

    def multi_get(self, keys: "list[str]") -> "list[bytes]":
        return [self.get(k) or b"" for k in keys]

    def add(self, key: str, n: int) -> int:
        import fcntl

        p = self._path(key)
        try:
            with open(p + ".lock", "a+b") as lk:
                fcntl.lockf(lk, fcntl.LOCK_EX)
                try:
                    cur = int((self.get(key) or b"0").decode() or 0)
                except ValueError:
                    cur = 0
                if n:
                    self.set(key, str(cur + n).encode())
                return cur + n
        except OSError as e:
            raise StoreGone("cannot update %s: %s" % (p, e.strerror or e)) from None


def _first_line(e: BaseException) -> str:
    s = str(e).strip()
    return s.splitlines()[0][:300] if s else type(e).__name__
