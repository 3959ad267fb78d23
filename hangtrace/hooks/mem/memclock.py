"""When a traced process's memory sampler starts its timer thread (issue 8).

In a forked child the thread starts at once (its parent's threads made it multi-threaded
already). At bootstrap it waits until the process runs past its start: ``defer_thread``.
Standard library only; never raises into the program.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

THREAD_NAME = "hangtrace-memory"  # the sampler's timer thread
_mono = time.monotonic_ns


def defer_thread(s: Any) -> bool:
    """At bootstrap: start sampler ``s``'s timer thread once the process runs past its
    start, not before. Returns False when it should start at once (torch imported already).

    Why: once a second thread exists, glibc's ``malloc``/``free`` leave their single-thread
    fast path for the rest of the process (``__libc_single_threaded`` is never set back),
    and torch's import and the interpreter's exit allocate and free a lot. Callgrind,
    traced ``import torch.distributed`` with OpenBLAS/OpenMP on one thread (as torchrun
    runs ranks): an idle thread started before the import cost 11M instructions; started
    right after it, 3M in exit's frees (``benchmarks/README.md``).

    When: at the first garbage collection one interval (``HANGTRACE_MEM_INTERVAL_S``) or
    more after the start, outside torch's import (``gc.callbacks``; a program that runs
    Python allocates, and collects); or at once when the process joins a process group or
    enters a phase or step (``kick``). Known gap: a process that joins no group, uses no
    phase or step, and after its first interval runs no collection (no net growth of
    container objects: lists, dicts, class instances; a list of ``bytearray`` or numpy
    buffers does not count) has its start sample only, and no timer samples."""
    t = sys.modules.get("torch")
    if t is not None and not initializing(t):
        return False
    import gc

    due = _mono() + s.interval_ns

    def clock(phase: str, info: Any) -> None:
        try:
            if _mono() < due and not s.dead:
                return
            t = sys.modules.get("torch")
            if t is not None and initializing(t):
                return  # (inside torch's import: the next collection after it)
            if start_thread(s):
                gc.callbacks.remove(clock)
        except Exception:
            pass

    gc.callbacks.append(clock)
    if t is None:
        _off_during_torch_import(clock)
    return True


def start_thread(s: Any) -> bool:
    """Start sampler ``s``'s timer thread (once). False when it cannot start now:
    ``threading``'s registry lock is held, maybe by this thread (a gc callback inside
    ``threading``), where it is not reentrant (an RLock in CPython 3.11: no check needed)."""
    if s.thread is not None or s.dead or s._stop.is_set():
        return True
    held = getattr(getattr(threading, "_active_limbo_lock", None), "locked", None)
    if held is not None and held():
        return False
    t = s.thread = threading.Thread(target=s._run, name=THREAD_NAME, daemon=True)
    try:
        t.start()
    except Exception:  # (at interpreter shutdown: no thread, no samples to take)
        s.thread = None
    return True


def _off_during_torch_import(clock: Any) -> None:
    """Take ``clock`` out of ``gc.callbacks`` for the length of torch's import, which runs
    about 380 collections (``import torch.distributed`` here) in which it never acts; it
    is put back once the import returns (``importhook``: a hook fires before and after).
    Measured: 0.78 us per collection with the callback, 0.04 us without. An import of
    torch that raises leaves it out: the thread then starts at a group join, a phase or a
    step (``kick``). Never raises."""
    import gc
    from hangtrace.hooks import importhook

    def before(_name: str) -> None:
        try:
            if clock in gc.callbacks:
                gc.callbacks.remove(clock)
        except Exception:
            pass

    def after(_module: Any) -> None:
        try:
            s = _sampler()
            if s is not None and s.thread is None and clock not in gc.callbacks:
                gc.callbacks.append(clock)
        except Exception:
            pass

    importhook.when_imported("torch", after, before=before)


def kick(s: Any = None) -> None:
    """A traced call that matters (a process group joined, a phase or step) before the
    timer thread of sampler ``s`` (default: this process's) started: start it now, unless
    torch's import is running (the clock starts it after). Never raises."""
    try:
        if s is None:
            s = _sampler()
        if s is None or s.thread is not None:
            return
        t = sys.modules.get("torch")
        if t is None or not initializing(t):
            start_thread(s)
    except Exception:
        pass


def _sampler() -> Any:
    """This process's sampler (``hooks/mem/memory.py``), or None; imports nothing."""
    return getattr(sys.modules.get("hangtrace.hooks.mem.memory"), "_sampler", None)


def initializing(module: Any) -> bool:
    """True while ``module``'s own code runs (importlib's ``__spec__._initializing``)."""
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))
