"""Bounded-time key/value access for the node watchers' meeting (issue 39).

:class:`StoreLink`: a client of the job's own torch.distributed ``TCPStore`` (the store
behind ``MASTER_ADDR:MASTER_PORT`` or the c10d rendezvous endpoint; its server thread keeps
answering while the ranks' Python is stuck), connected with
``TCPStore(host, port, is_master=False, timeout=..., wait_for_workers=False)``: every
operation is bounded by that timeout (``HANGTRACE_STORE_TIMEOUT_S``), and a ``get`` is asked
only after ``check`` found the key (a missing key would block until the timeout).
:class:`DirLink`: the same four operations over files in a shared directory
(``HANGTRACE_SHARED_DIR``; written whole and renamed into place, never memory-mapped; the
counter under ``fcntl.lockf``). Both raise :class:`StoreGone` when the other side cannot be
reached; nothing here blocks longer than the timeout.

torch is imported only here, only in a watcher of a multi-node job (about 1-2 s of start-up,
paid in the meeting's own thread: the stall and death detection never waits for it).
"""

from __future__ import annotations

import os
from typing import Any, Optional


class StoreGone(Exception):
    """The store (or shared directory) cannot be reached; the message says why."""


class StoreLink:
    """The job's TCPStore as a client; ``timeout_s`` bounds every operation (seconds)."""

    def __init__(self, host: str, port: int, timeout_s: float = 5.0) -> None:
        import datetime

        self.where = "the job's store at %s:%d" % (host, port)
        self.bytes_out = self.bytes_in = 0
        # torch's C++ log prints a stack trace (WARNING, ERROR) for every failed operation on a store that
        # went away (measured: "sendBytes failed ... Broken pipe"); we say it in one line
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
        try:
            import torch.distributed as dist

            self._s: Any = dist.TCPStore(
                host,
                int(port),
                is_master=False,
                timeout=datetime.timedelta(seconds=timeout_s),
                wait_for_workers=False,
            )
        except Exception as e:
            raise StoreGone("cannot connect to %s: %s" % (self.where, _first_line(e))) from None

    def _op(self, what: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
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
