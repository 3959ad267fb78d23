"""Completion of async torch.distributed work (``async_op=True``, ``isend``/``irecv``):
recorded by our own poller thread rather than future callbacks on torch's C++ thread
(those aborted the process about 1 in 15 runs at exit: pthread_exit in a C++ frame during
finalization), and the ``batch_isend_irecv`` wrapper whose works it completes. Split out of ``torch_dist.py``, whose state (``torch_dist._state``) it uses.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Tuple

from hangtrace.tracer.ring import layout as F

if TYPE_CHECKING:
    from hangtrace.hooks.record.recorder import Recorder


# Per call (a failed or an async op): ``_td._state`` is read unchecked, as in torch_dist's helpers
# (the callers checked it; a check would cost every call), hence "type: ignore[union-attr]".
def _finish_error(idx: int, e: BaseException) -> None:
    try:
        _td._state.rec.complete(idx, err="%s: %s" % (type(e).__name__, e))  # type: ignore[union-attr]
    except Exception as e2:
        _td._state.log("recording a failure failed: %r" % (e2,), "fail-rec")  # type: ignore[union-attr]


def _on_work_done(idx: int, work: Any) -> None:
    """Record completion of an async op when its Work finishes (the Work itself is untouched).

    One daemon thread of ours polls ``Work.is_completed()`` (``_Poller``). Not
    ``work.get_future().then(cb)``: torch runs such a Python callback on the backend's
    C++ thread, and when that happens while the interpreter finalizes (the program
    waited, then exited), CPython ends the thread with ``pthread_exit`` inside a C++
    frame and the process aborts ("terminate called without an active exception",
    seen here on gloo about once in 15 runs). gloo's p2p Work also has no future
    ("Work::getFuture not implemented", torch 2.13).
    """
    _poller().add(idx, work, _td._state.rec)  # type: ignore[union-attr]


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


def _batch_wrapper(
    wrapped: Callable[..., Any], instance: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]
) -> Any:
    ident = _td._get_ident()
    st = _td._state
    if ident in _td._busy or st is None:
        return wrapped(*args, **kwargs)
    idxs: List[int] = []
    try:
        if st.fault:
            raise RuntimeError("hangtrace test fault: recorder failure")
        ops: Any = args[0] if args else kwargs.get("p2p_op_list")  # P2POp list (None: TypeError, logged)
        for p in ops:
            opname = getattr(p.op, "__name__", "isend")
            gsid, gname = _td._group_key(p.group)
            peer = getattr(p, "peer", -1)
            if peer is None:
                peer = st.dist.get_global_rank(p.group, p.group_peer)
            cell = st.seq_cell((gname, int(peer)))
            cell[0] += 1
            seq = cell[0]
            t = p.tensor
            idxs.append(
                st.rec.issue(
                    F.K_P2P,
                    F.OP_IDS.get(opname, F.OP_IDS["isend"]),
                    gsid,
                    seq,
                    t.numel(),
                    _td._shape_id(t.shape),
                    _td._dtype_id(t),
                    int(peer),
                    F.F_ASYNC | F.F_BATCH,
                )
            )
    except Exception as e:
        st.log("recording batch_isend_irecv failed: %r" % (e,), "rec-batch")
    _td._busy[ident] = 1
    try:
        works = wrapped(*args, **kwargs)
    except BaseException as e:
        del _td._busy[ident]
        for i in idxs:
            _finish_error(i, e)
        raise
    del _td._busy[ident]
    try:
        if works is not None and len(works) == len(idxs):
            for i, w in zip(idxs, works):
                _on_work_done(i, w)
        elif works:
            for i in idxs:
                _on_work_done(i, works[-1])
    except Exception as e:
        st.log("batch completion failed: %r" % (e,), "done-batch")
    return works


# last: torch_dist imports this module at its end (either may be imported first)
from hangtrace.hooks.torchdist import torch_dist as _td  # noqa: E402
