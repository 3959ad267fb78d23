"""Lifecycle records: start, clean exit (with code), uncaught exceptions, signals.

- exit: ``atexit`` writes the exit record; the code comes from ``sys.exit(n)``
  (wrapped), 1 after an uncaught exception, else 0. ``os._exit(n)`` (used by
  multiprocessing's forked children) is wrapped too, since it skips atexit.
  A process that does ``raise SystemExit(n)`` directly is recorded with code 0 unless
  the launcher (``hangtrace run``) saw the real status.
- uncaught exceptions: ``sys.excepthook`` and ``threading.excepthook`` are chained.
- SIGTERM: ``faulthandler.register(SIGTERM, chain=True)`` writes all thread stacks to
  ``stacks/sigterm-<host>-<pid>.txt`` from C (works while the main thread is blocked
  inside a collective), then re-raises to the previous handler, so the exit status
  is what it would have been. With the C extension a line naming the sender comes
  first (``_fastrec.sigterm_sender_target``: its pid, uid and command line). A Python
  handler installed later by the program (``signal.signal``) is kept under ours (CPython
  ``faulthandler.c``: the user handler chains to the previous ``sigaction``).
- fatal signals (SIGSEGV, SIGFPE, SIGABRT, SIGBUS, SIGILL): ``faulthandler.enable``
  into ``stacks/fatal-<host>-<pid>.txt`` unless the program enabled faulthandler itself.
- on-demand stack dump: SIGUSR2 is registered (only when its disposition is SIG_DFL)
  to write ``stacks/dump-<host>-<pid>.txt``; the ring header records the signal number
  so the collector never signals a process that did not register it.
"""

from __future__ import annotations

import faulthandler
import os
import _signal
import signal
import sys
import threading
from typing import Any, List, Optional

from hangtrace.hooks.instrument import Instrumentor

from hangtrace.hooks.process import failures
from hangtrace.hooks.process.faultline import fault_line_disposition, restore_default
from hangtrace.hooks.process.patching import patch, unpatch
from hangtrace.hooks import importhook

DUMP_SIGNAL = signal.SIGUSR2

_rt: Any = None  # the Runtime (hooks/bootstrap.py), or None when detached
_exit_code: List[Optional[int]] = [None]
_files: List[int] = []  # descriptors of our stack files
_empty_at_exit: List["tuple[int, str]"] = []  # (fd, path) of our stack files: removed when empty
_stacks_dir: List[Optional[str]] = [None]


def _format_exception(etype: Any, evalue: Any, tb: Any) -> str:
    import traceback  # only when an exception is recorded: not at start-up

    return "".join(traceback.format_exception(etype, evalue, tb))


def stack_file(run_dir: str, kind: str, host: str, pid: int) -> str:
    """Path of a faulthandler output file: kind is 'sigterm', 'fatal' or 'dump'."""
    return "%s/stacks/%s-%s-%d.txt" % (run_dir, kind, host, pid)  # (POSIX; no os.path in a forked child)


def _open(kind: str) -> int:
    """A stack file opened for faulthandler (a plain descriptor: faulthandler writes to the
    fd anyway; a Python file object costs more to open in every forked child)."""
    rec = _rt.recorder
    d = _rt.run_dir + "/stacks"
    if _stacks_dir[0] != d:  # made once per run directory; a forked child finds it made
        os.makedirs(d, mode=0o700, exist_ok=True)
        _stacks_dir[0] = d
    path = stack_file(_rt.run_dir, kind, rec.host, rec.pid)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    _files.append(fd)
    _empty_at_exit.append((fd, path))
    return fd


def _drop_empty_stack_files() -> None:
    """Remove this process's stack files that stayed empty (issue 40: every process left
    them, up to 3 empty files each). Called at a clean exit, after the exit record: the
    watcher and the analysis read a missing file as an empty one. (A fatal signal while
    the interpreter finalises after this point writes to the unlinked file: the exit
    record is written and the launcher sees the signal in the exit status.)"""
    for fd, path in _empty_at_exit:
        try:
            if os.fstat(fd).st_size == 0 and os.stat(path).st_ino == os.fstat(fd).st_ino:
                os.unlink(path)
        except OSError:
            pass
    del _empty_at_exit[:]


def _on_exit() -> None:
    """Write the exit record and close the ring (called last by bootstrap's exit handler,
    after the other instrumentors stopped their threads)."""
    rt = _rt
    if rt is None or rt.recorder.closed:
        return
    try:
        code = _exit_code[0]
        if code is None:
            code = 0
        if not code and getattr(rt.recorder, "lazy", False):  # (a clean helper: its ring dies unread)
            rt.recorder.close()
            return
        rt.recorder.event("exit", code=code)
        rt.recorder.mark_exit(code)
        rt.recorder.close()
        _drop_empty_stack_files()
    except Exception as e:
        rt.log("exit record failed: %r" % (e,), "exit")


def exit_code() -> Optional[int]:
    """The exit code this process is ending with as far as seen so far: ``sys.exit``'s
    argument, 1 after an uncaught exception, or None (a clean end, or not known yet)."""
    return _exit_code[0]


def _code_of(arg: Any) -> int:
    if arg is None:
        return 0
    if isinstance(arg, int):
        return arg
    return 1


def _sys_exit_wrapper(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    try:
        code = _exit_code[0] = _code_of(args[0] if args else kwargs.get("status"))
        failures.exiting(code)  # an exception being handled is the real cause
    except Exception:
        pass
    return wrapped(*args, **kwargs)


def _os_exit_wrapper(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    try:
        rt = _rt
        if rt is not None and not rt.recorder.closed and rt.recorder.pid == os.getpid():
            code = int(args[0] if args else kwargs.get("status", 0))
            if code or not getattr(rt.recorder, "lazy", False):  # (a ring still in memory dies unread)
                failures.exiting(code)
                rt.recorder.event("exit", code=code, via="os._exit")
                rt.recorder.mark_exit(code)
    except Exception:
        pass
    return wrapped(*args, **kwargs)


def _excepthook_wrapper(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    try:
        etype, evalue, tb = args[:3]
        if not issubclass(etype, SystemExit):  # KeyboardInterrupt counts: the process dies of it
            _exit_code[0] = 1
            _rt.recorder.event(
                "exception",
                type=etype.__name__,
                message=str(evalue)[:4000],
                traceback=_format_exception(etype, evalue, tb)[-16000:],
            )
    except Exception as e:
        try:
            _rt.log("exception record failed: %r" % (e,), "excepthook")
        except Exception:
            pass
    return wrapped(*args, **kwargs)


def _thread_excepthook_wrapper(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    try:
        a = args[0]
        if a.exc_type is not SystemExit:
            _rt.recorder.event(
                "thread_exception",
                type=a.exc_type.__name__,
                message=str(a.exc_value)[:4000],
                thread_name=getattr(a.thread, "name", None),
                traceback=_format_exception(a.exc_type, a.exc_value, a.exc_traceback)[-16000:],
            )
    except Exception:
        pass
    return wrapped(*args, **kwargs)


def _shutdown_wrapper(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """``threading._shutdown`` (the interpreter's join of the non-daemon threads once the
    main program returned; multiprocessing's children call it too): an ``exiting`` event
    with those threads (name, native id), so a process that never gets past it is known to
    be at exit and what it waits for (analyze/stuck/exitwait.py). Written when a thread is to be
    joined, and in a process whose ring is on disk anyway (a lazy helper's ring stays in
    memory when it has nothing to wait for)."""
    try:
        rt = _rt
        rec = rt.recorder if rt is not None else None
        if rec is not None and not rec.closed and rec.pid == os.getpid():
            me = threading.current_thread()
            waits = [t for t in threading.enumerate() if t is not me and not t.daemon]
            if waits or not getattr(rec, "lazy", False):
                rec.event(
                    "exiting",
                    threads=[{"name": t.name, "native_id": t.native_id} for t in waits[:16]],
                    more=max(0, len(waits) - 16),
                )
    except Exception:
        pass
    return wrapped(*args, **kwargs)


def _signal_wrapper(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """signal.signal: when the program sets SIGTERM, keep our C-level stack dump on top."""
    signum = args[0] if args else kwargs.get("signalnum")
    if signum != signal.SIGTERM or _rt is None or not _sigterm_file:
        return wrapped(*args, **kwargs)
    try:
        faulthandler.unregister(signal.SIGTERM)
    except Exception:
        pass
    try:
        return wrapped(*args, **kwargs)
    finally:  # also when signal.signal raises (e.g. ValueError outside the main thread)
        try:
            faulthandler.register(signal.SIGTERM, file=_sigterm_file[0], all_threads=True, chain=True)
            _sender_target(_sigterm_file[0])
        except Exception:
            pass


def _sender_target(f: Any) -> None:
    """Who sent SIGTERM, on top of faulthandler's handler: a line before the dump in the
    SIGTERM stack file ``f`` (``_fastrec.sigterm_sender_target``; without the C extension
    the dump alone). Never raises."""
    fr = getattr(sys.modules.get("hangtrace.hooks.record.recorder"), "_fastrec", None)
    if fr is not None:
        try:
            fr.sigterm_sender_target(f if isinstance(f, int) else f.fileno())
        except Exception:
            pass


def _on_worker_signals(module: Any) -> None:
    """torch's DataLoader worker signal handlers: faulthandler kept on top (hooks/process/workersignals.py)."""
    from hangtrace.hooks.process import workersignals

    workersignals.patch(module, lambda: _fatal_fd[0] if _own_fatal[0] and _fatal_fd else None)


_sigterm_file: List[Any] = []
_own_fatal = [False]  # True when the fatal-signal faulthandler is ours (not the program's)
_fatal_fd: List[int] = []  # its file's descriptor (hooks/process/workersignals.py)


def detach() -> None:
    """Stop recording lifecycle events and signal stacks (a forked child whose own ring
    could not be created: the parent's ring and stack files must stay the parent's).
    The wrappers stay installed and pass through; signal dispositions go back to what
    they were before our registrations."""
    global _rt
    _rt = None
    del _sigterm_file[:]
    for sig in (signal.SIGTERM, DUMP_SIGNAL):
        try:
            faulthandler.unregister(sig)
        except Exception:
            pass
    try:
        if _own_fatal[0]:
            faulthandler.disable()
            _own_fatal[0] = False
    except Exception:
        pass
    _close_files()


def _close_files() -> None:
    del _empty_at_exit[:]
    for fd in _files:
        try:
            os.close(fd)
        except Exception:
            pass
    del _files[:]


def install(rt: Any, forked_from: Optional[int] = None) -> None:
    """Install lifecycle hooks for Runtime ``rt`` (again in a forked child, with the
    parent's pid as ``forked_from``: start record, own faulthandler files)."""
    global _rt
    _rt = rt
    rec = rt.recorder
    # (a forked helper's lazy ring writes it when it goes to its file: ringsize.start_event)
    rec.start_event(
        argv=list(sys.argv)[:50], executable=sys.executable, ppid=os.getppid(), forked_from=forked_from
    )
    _close_files()
    del _sigterm_file[:]
    if forked_from is None:
        patch(sys, "exit", _sys_exit_wrapper)
        patch(os, "_exit", _os_exit_wrapper)
        patch(sys, "excepthook", _excepthook_wrapper)
        patch(threading, "excepthook", _thread_excepthook_wrapper)
        patch(signal, "signal", _signal_wrapper)
        if callable(getattr(threading, "_shutdown", None)):  # (CPython 3.8-3.13 call it by name at exit)
            patch(threading, "_shutdown", _shutdown_wrapper)
    else:
        _exit_code[0] = None
    try:
        if (forked_from is not None and _own_fatal[0]) or not faulthandler.is_enabled():
            # issue 12; a forked child inherits the dispositions (and faulthandler keeps its
            # saved ones: enable() on an enabled handler only takes the new file)
            ign = fault_line_disposition() if forked_from is None else []
            try:
                _fatal_fd[:] = [_open("fatal")]
                faulthandler.enable(file=_fatal_fd[0], all_threads=True)
            except Exception:
                restore_default(ign)
                raise
            _own_fatal[0] = True
    except Exception as e:
        rt.log("faulthandler for fatal signals failed: %r" % (e,), "fh-fatal")
    try:
        f = _open("sigterm")
        # (in a forked child the registration is inherited: registering again only takes
        # the child's file, CPython faulthandler_register_py; no sigaction calls)
        faulthandler.register(signal.SIGTERM, file=f, all_threads=True, chain=True)
        _sigterm_file.append(f)
        _sender_target(f)
    except Exception as e:
        rt.log("faulthandler for SIGTERM failed: %r" % (e,), "fh-term")
    try:
        if _signal.getsignal(DUMP_SIGNAL) in (signal.SIG_DFL, None):  # (the C one: no enum)
            faulthandler.register(DUMP_SIGNAL, file=_open("dump"), all_threads=True, chain=False)
            rec.set_dump_signal(int(DUMP_SIGNAL))
    except Exception as e:
        rt.log("faulthandler dump signal failed: %r" % (e,), "fh-dump")


class LifecycleInstrumentor(Instrumentor):
    """Start and exit records, uncaught exceptions, signal stacks (this module's hooks).

    Installed first and left last: its ``at_exit`` writes the exit record and closes the
    ring after the other instrumentors stopped their threads."""

    name = "lifecycle"

    def _install(self, runtime: Any) -> None:
        install(runtime)
        importhook.when_imported("torch.utils.data._utils.signal_handling", _on_worker_signals)

    def _uninstall(self) -> None:
        detach()
        unpatch()

    def _after_fork_child(self) -> None:
        rt = self.runtime
        assert rt is not None  # after_fork runs only for an installed instrumentor
        install(rt, forked_from=rt.parent_pid)

    def _at_exit(self) -> None:
        _on_exit()
