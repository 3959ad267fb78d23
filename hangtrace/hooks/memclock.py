"""When a traced process's memory sampler starts its timer thread (issue 8).

In a forked child the thread starts at once (its parent's threads made it multi-threaded
already). At bootstrap it waits until the process is past its start: ``defer_thread``.
Standard library only; never raises into the program.
"""
from __future__ import annotations

import sys
import time
from typing import Any

_mono = time.monotonic_ns


def defer_thread(s: Any) -> bool:
    """At bootstrap (issue 8): start the timer thread once the process is past its start,
    not before. Why: once a second thread exists, glibc's ``malloc``/``free`` leave their
    single-thread fast path for the rest of the process, and torch's import allocates a
    lot: an idle thread made a single-threaded ``import torch.distributed`` cost 11M more
    instructions (callgrind, ``benchmarks/README.md``). When: right after torch's import
    (a post-import hook), else at the first garbage collection one interval after the
    start (``gc.callbacks``), else at the first phase or step (``kick``). Known gap: a
    process that never imports torch and after its first second neither runs a garbage
    collection (net growth of container objects: lists, dicts, class instances; a list of
    ``bytearray`` or numpy buffers does not count) nor enters a phase or step has its start
    sample only, and no timer samples. Returns False when the thread should start at once
    (torch imported already)."""
    t = sys.modules.get("torch")
    if t is not None and not initializing(t):
        return False
    import gc
    from hangtrace.hooks import importhook
    due = _mono() + s.interval_ns

    def clock(phase: str, info: Any) -> None:
        try:
            if _mono() < due and not s.dead:
                return
            t = sys.modules.get("torch")
            if t is not None and initializing(t):
                return  # (inside torch's import: its post-import hook starts the thread)
            if s.start_thread():
                gc.callbacks.remove(clock)
        except Exception:
            pass

    def torch_imported(module: Any) -> None:
        if not s.start_thread() and clock not in gc.callbacks:
            gc.callbacks.append(clock)
    gc.callbacks.append(clock)
    importhook.when_imported("torch", torch_imported)
    return True


def initializing(module: Any) -> bool:
    """True while ``module``'s own code runs (importlib's ``__spec__._initializing``)."""
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


def kick(s: Any) -> None:
    """The phase/step API sampled ``s`` before its timer thread started: start it now,
    unless torch's import is running (its post-import hook starts it)."""
    t = sys.modules.get("torch")
    if t is None or not initializing(t):
        s.start_thread()
