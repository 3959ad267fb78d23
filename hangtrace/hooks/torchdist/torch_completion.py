"""Completion of async torch.distributed work (``async_op=True``, ``isend``/``irecv``,
``batch_isend_irecv``): recorded by our own poller thread. In: (record index, Work or
Future, recorder) from ``torch_dist._on_work_done``; out: ``Recorder.complete`` once the
Work is completed, and ``flush()`` at exit.

Not ``work.get_future().then(cb)``: torch runs such a Python callback on the backend's C++
thread, and when that happens while the interpreter finalizes (the program waited, then
exited), CPython ends the thread with ``pthread_exit`` inside a C++ frame and the process
aborts ("terminate called without an active exception", seen here on gloo about once in 15
runs). gloo's p2p Work also has no future ("Work::getFuture not implemented", torch 2.13).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, List, Tuple

if TYPE_CHECKING:
    from hangtrace.hooks.record.recorder import Recorder


_poller_inst: List[_Poller] = []


class _Poller:
    """Daemon thread that polls ``Work.is_completed()`` of pending async ops every 5 ms
    (only while some are pending; completion times are late by at most that).

    ``stop()`` (called at exit) joins the thread: a thread of ours must never be inside a
    torch call when the interpreter finalizes. pybind releases the GIL in such calls and
    CPython then ends the thread with ``pthread_exit`` while it re-acquires the GIL, in a
    C++ frame, which aborts the process ("terminate called without an active exception").
    """

    MAX_PENDING = 4096

    def __init__(self) -> None:
        self.pending: List[Tuple[int, Any, Recorder]] = []  # (record index, Work or Future, recorder)
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.stopping = False
        self.pid = __import__("os").getpid()
        self.thread = threading.Thread(target=self.run, name="hangtrace-async-poller", daemon=True)
        self.thread.start()

    def add(self, idx: int, work: Any, rec: Recorder) -> None:
        with self.lock:
            if len(self.pending) < self.MAX_PENDING and not self.stopping:
                self.pending.append((idx, work, rec))
        self.wake.set()

    def run(self) -> None:
        import time

        while not self.stopping:
            self.wake.wait()
            if self.stopping:
                return
            time.sleep(0.005)
            self.poll()

    def poll(self) -> None:
        """Check every pending Work once (also called at exit)."""
        with self.lock:
            items, self.pending = self.pending, []
        keep = []
        for idx, work, rec in items:
            try:
                # is_completed() only: wait() can block (after destroy_process_group)
                # and is_success()/exception() print deprecation warnings (torch 2.13),
                # so a polled op's failure is not distinguished from its completion.
                # a Work, or the torch.futures.Future that all_reduce_coalesced and
                # all_gather_coalesced return for async_op=True (no is_completed)
                done = getattr(work, "is_completed", None) or work.done
                if done():
                    rec.complete(idx)
                else:
                    keep.append((idx, work, rec))
            except Exception:
                pass
        with self.lock:
            self.pending = keep + self.pending
            if not self.pending:
                self.wake.clear()

    def stop(self, timeout_s: float = 2.0) -> None:
        self.stopping = True
        self.wake.set()
        if self.thread is not threading.current_thread():
            self.thread.join(timeout_s)


def flush() -> None:
    """At exit: stop the poller thread, record the completions it can still see, and drop
    our references to Work objects (before interpreter teardown, not during it)."""
    import os

    if _poller_inst and _poller_inst[0].pid == os.getpid():
        p = _poller_inst[0]
        p.stop()
        p.poll()
        with p.lock:
            p.pending = []


def _poller() -> _Poller:
    import os

    if not _poller_inst or _poller_inst[0].pid != os.getpid():
        _poller_inst[:] = [_Poller()]
    return _poller_inst[0]
