"""This process's memory sampler (issue 5; the sampler itself: ``sampler.py``): started
at activation (``MemoryInstrumentor``; ``HANGTRACE_MEM=0``: none), taken over or abandoned
in a forked child (``memfork.py``), stopped at exit; ``sys.excepthook`` chained so that an
out-of-memory error reaching it writes a MEM_OOM sample. In: the Runtime (recorder, run
log, run directory); out: the active Sampler (``active()``, also ``api._set_sampler``).

Nothing here raises into the program: every entry point swallows its errors and logs
each kind once to the run log. Standard library only.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any, Callable, Optional

from hangtrace.hooks.instrument import Instrumentor
from hangtrace.hooks.mem.sampler import Sampler, _memfork
from hangtrace.tracer import api
from hangtrace.tracer import config

_sampler = None
_lock = threading.Lock()

__all__ = ["MemoryInstrumentor", "start", "stop", "active"]


_prev_excepthook: Callable[..., Any] = sys.__excepthook__  # what _excepthook chains to (set when installed)


def _excepthook(etype: Any, evalue: Any, tb: Any) -> Any:
    s = _sampler
    if s is not None:
        s.on_exception(etype, evalue)
    return _prev_excepthook(etype, evalue, tb)


def _install_excepthook() -> None:
    global _prev_excepthook
    cur = sys.excepthook
    if getattr(cur, "_hangtrace_mem", False):
        return
    _prev_excepthook = cur
    setattr(_excepthook, "_hangtrace_mem", True)  # (marks it installed, for the check above)
    sys.excepthook = _excepthook


def _after_fork_child(rt: Any = None) -> Optional[Sampler]:
    """In a forked child the inherited sampler (its thread is gone, its descriptors and
    ring are the parent's) must never write into the parent's ring again. With Runtime
    ``rt`` it is taken over for the child's own ring (``memfork.take_over``) and its timer
    thread started: returns it. Else, or when that fails, it is abandoned: None."""
    global _sampler
    s = _sampler
    if s is None or s.pid == os.getpid():
        return None
    if rt is not None and _memfork().take_over(s, rt):
        return s
    s.abandon()
    _sampler = None
    api._set_sampler(None)
    return None


def start(rt: Any, forked: bool = False) -> Optional[Sampler]:
    """Start sampling for Runtime ``rt`` (from ``bootstrap.activate``, and in a forked child
    whose parent's sampler could not be taken over). Returns the Sampler or None (off, or
    failed)."""
    global _sampler
    with _lock:
        old = _sampler
        if old is not None:
            if old.pid == os.getpid() and not forked:
                return old
            old.abandon()
            _sampler = None
            api._set_sampler(None)
        if not config.mem_enabled():
            return None
        try:
            s = Sampler(rt.recorder, rt.log, config.get_float(config.MEM_INTERVAL_S), rt.run_dir)
            _sampler = s
            api._set_sampler(s)
            _install_excepthook()
            s.start(defer=not forked)
            return s
        except Exception as e:
            _sampler = None
            api._set_sampler(None)
            rt.log("memory sampling disabled: %r" % (e,), "mem-start")
            return None


def stop() -> None:
    """Stop the timer thread and phase/step sampling (tests, benchmarks)."""
    global _sampler
    with _lock:
        s = _sampler
        _sampler = None
        api._set_sampler(None)
        if s is not None:
            s.stop()


def active() -> Optional[Sampler]:
    return _sampler


class MemoryInstrumentor(Instrumentor):
    """Memory sampling (this module): the sampler and its timer thread, the OOM hooks.

    ``HANGTRACE_MEM=0`` installs nothing. Stopped at exit before the exit record."""

    name = "memory"

    def _install(self, runtime: Any) -> None:
        start(runtime)

    def _uninstall(self) -> None:
        stop()

    def _after_fork_child(self) -> None:
        if _after_fork_child(self.runtime) is None:
            start(self.runtime, forked=True)

    def _at_exit(self) -> None:
        stop()
