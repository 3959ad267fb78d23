"""Failures caught at their source, before a launcher or a framework swallows them.

Launchers and frameworks catch the exceptions of the code they run, print or forward
them, and exit 1, so ``sys.excepthook`` never runs and the flight record would only
say "exit code 1" (DESIGN.md, "Launchers and frameworks swallow failures"). Each entry
of :data:`SOURCES` is one place where such a failure is still visible, and records it
into the ring as a durable event before it is swallowed:

=======================  ==============================================================
source                   how it is seen
=======================  ==============================================================
``exit-while-handling``  ``sys.exit(n)`` / ``os._exit(n)`` with ``n != 0`` called while an
                         exception is being handled (``sys.exc_info()``): torch's
                         ``multiprocessing.spawn`` worker wrapper (``_wrap``: ``except
                         Exception: error_queue.put(format_exc()); sys.exit(1)``), and
                         most hand-written launcher wrappers. Event ``exception``.
``multiprocessing``      ``multiprocessing.process.BaseProcess._bootstrap`` catches the
                         exception of ``run()``, prints it and returns exit code 1 (fork:
                         ``os._exit(1)``; spawn: ``sys.exit(1)`` after the exception was
                         cleared). We wrap the instance's ``run`` for the duration of
                         ``_bootstrap``. Event ``exception``.
``torchelastic``         torchelastic's error file (``TORCHELASTIC_ERROR_FILE``), when a
                         ``@record``-decorated main writes it or the agent reads a failed
                         worker's: ``hooks/process/elastic_errors.py``. Event ``elastic_error``.
``ray-train``            a framework that catches the user's exception in the thread that
                         raised it (:data:`FRAMEWORK_CATCHES`: Ray Train V2's training
                         thread); recorded there, before the framework wraps it. Event
                         ``exception``.
``asyncio-task``         an exception in an asyncio task nobody awaits is never printed
                         while the task object lives. Every task created through
                         ``BaseEventLoop.create_task`` gets a done callback; one loop
                         iteration after the task failed (so an awaiter's wake-up ran
                         first) the exception is recorded if it is still unretrieved
                         (``Task._log_traceback``: CPython ``Lib/asyncio/futures.py``).
                         Event ``task_exception``: the process lives on.
=======================  ==============================================================

Ray actor task errors are recorded by ``ray_hooks`` (the method's phase exit carries
the exception) and background-thread exceptions by ``lifecycle`` (``thread_exception``).

Every hook passes the original call's arguments, return value and exceptions through
unchanged and swallows its own errors (reported once to the run log).
"""

from __future__ import annotations

import functools
import threading
import sys
from typing import TYPE_CHECKING, Any, Callable, List, Optional

#: Where a failure was caught (the ``caught_by`` field of the event).
SOURCES = ("exit-while-handling", "multiprocessing", "torchelastic", "ray-train", "asyncio-task")

_MESSAGE_MAX = 4000  # characters kept of an exception message
_TRACEBACK_MAX = 16000  # characters kept of a formatted traceback (the innermost part)


if TYPE_CHECKING:  # (a Protocol class costs ~0.2M instructions to create: not at start-up)
    from typing import Protocol

    class _Recorder(Protocol):
        def event(self, kind: str, **fields: Any) -> Any: ...


_get_recorder: Callable[[], Optional[_Recorder]] = lambda: None  # noqa: E731


def _no_log(msg: str, key: Optional[str] = None) -> None:
    """The log until ``configure`` sets one."""


_log: Callable[[str, Optional[str]], None] = _no_log
_recorded: set[int] = set()  # id() of exceptions already recorded in this process


def configure(
    get_recorder: Callable[[], Optional[_Recorder]], log: Callable[[str, Optional[str]], None]
) -> None:
    """Set where events go: ``get_recorder()`` returns this process's recorder (or None
    when tracing is off or was detached); ``log(msg, key)`` writes once per key."""
    global _get_recorder, _log
    _get_recorder, _log = get_recorder, log


def _format(exc: BaseException) -> tuple[str, str, str]:
    import traceback  # only when a failure is recorded: not at start-up (about 2 ms)

    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return type(exc).__name__, str(exc)[:_MESSAGE_MAX], tb[-_TRACEBACK_MAX:]


def record_exception(exc: BaseException, caught_by: str, kind: str = "exception", **extra: Any) -> None:
    """Record ``exc`` once (by identity) as a durable event ``kind`` with the place that
    caught it. Never raises."""
    try:
        if id(exc) in _recorded:
            return
        rec = _get_recorder()
        if rec is None:
            return
        etype, message, tb = _format(exc)
        rec.event(kind, type=etype, message=message, traceback=tb, caught_by=caught_by, **extra)
        _recorded.add(id(exc))
    except Exception as e:
        _log("recording a caught exception failed: %r" % (e,), "failures-record")


def record_event(kind: str, **fields: Any) -> None:
    """Record a durable event ``kind`` as it is. Never raises."""
    try:
        rec = _get_recorder()
        if rec is not None:
            rec.event(kind, **fields)
    except Exception as e:
        _log("recording a %s event failed: %r" % (kind, e), "failures-event")


def exiting(code: int) -> None:
    """Called by the exit wrappers with the exit status about to be used: a non-zero
    exit while an exception is being handled records that exception (spawn's ``_wrap``)."""
    try:
        if not code:
            return
        exc = sys.exc_info()[1]
        if exc is not None and not isinstance(exc, SystemExit):
            record_exception(exc, "exit-while-handling", exit_code=code)
    except Exception:
        pass


# --- multiprocessing ---------------------------------------------------------------------
def _wrap_run(run: Callable[[], Any]) -> Callable[[], Any]:
    def run_recorded() -> Any:
        try:
            return run()
        except SystemExit:
            raise
        except BaseException as e:
            record_exception(e, "multiprocessing")
            raise

    return run_recorded


def _patch_method(cls: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Replace ``cls.name`` by ``make(original)`` once (a plain function marked
    ``__hangtrace_wrapped__``; no wrapt: these modules are imported early by most programs)."""
    orig = vars(cls).get(name)
    if orig is None or getattr(orig, "__hangtrace_wrapped__", None) is not None:
        return
    new = make(orig)
    new.__hangtrace_wrapped__ = orig  # type: ignore[attr-defined]
    functools.update_wrapper(new, orig)
    setattr(cls, name, new)


def _make_bootstrap(orig: Callable[..., Any]) -> Callable[..., Any]:
    def _bootstrap(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            if "run" not in vars(self):
                self.run = _wrap_run(self.run)
        except Exception as e:
            _log("wrapping Process.run failed: %r" % (e,), "failures-mp")
        return orig(self, *args, **kwargs)

    return _bootstrap


def hook_multiprocessing(module: Any) -> None:
    """Post-import hook for ``multiprocessing.process``: wrap ``BaseProcess._bootstrap``."""
    cls = getattr(module, "BaseProcess", None)
    if cls is not None:
        _patch_method(cls, "_bootstrap", _make_bootstrap)


# --- asyncio -----------------------------------------------------------------------------
def _task_done(task: Any) -> None:
    try:
        if task.cancelled() or getattr(task, "_exception", None) is None:
            return
        loop = task.get_loop()
        loop.call_soon(_check_unretrieved, task)  # after the awaiters' wake-ups
    except Exception:
        pass


def _check_unretrieved(task: Any) -> None:
    try:
        exc = getattr(task, "_exception", None)
        if exc is None or not getattr(task, "_log_traceback", False):
            return  # an awaiter (or gather, or a done callback) retrieved it
        if not isinstance(exc, Exception):
            return  # SystemExit / KeyboardInterrupt in a task: a deliberate exit, not a failure
        coro = getattr(task, "get_coro", lambda: None)()
        record_exception(
            exc,
            "asyncio-task",
            kind="task_exception",
            task=task.get_name(),
            coro=getattr(coro, "__qualname__", None),
        )
    except Exception:
        pass


def _make_create_task(orig: Callable[..., Any]) -> Callable[..., Any]:
    # asyncio_tasks.note_loop, imported at the first task created (torch.distributed imports
    # asyncio: most ranks never create a task)
    note: List[Optional[Callable[[Any], None]]] = [None]

    def create_task(self: Any, *args: Any, **kwargs: Any) -> Any:
        task = orig(self, *args, **kwargs)
        try:
            fn = note[0]
            if fn is None:
                from hangtrace.hooks.process.asyncio_tasks import note_loop

                fn = note[0] = note_loop
            fn(self)  # its pending tasks at snapshot time
            task.add_done_callback(_task_done)
        except Exception:
            pass
        return task

    return create_task


def hook_asyncio(module: Any) -> None:
    """Post-import hook for ``asyncio.base_events``: every task created through
    ``BaseEventLoop.create_task`` (``asyncio.create_task``, ``ensure_future``,
    ``gather`` …) is watched for an exception nobody retrieves."""
    cls = getattr(module, "BaseEventLoop", None)
    if cls is not None:
        _patch_method(cls, "create_task", _make_create_task)


def hook_elastic(module: Any) -> None:
    """Post-import hook for ``torch.distributed.elastic.multiprocessing.errors``: its error
    files (``hooks/process/elastic_errors.py``)."""
    from hangtrace.hooks.process import elastic_errors

    elastic_errors.configure(record_event)
    elastic_errors.hook_errors(module, _patch_method)


# --- frameworks that catch the user's exception in the thread that raised it --------------
#: (module, function, caught_by): a function a framework calls with the user's exception,
#: in the thread that raised it, right after catching it. Ray Train V2 (ray 2.60,
#: ``ray/train/v2/_internal/execution/worker_group/thread_runner.py``): ``ThreadRunner.run``
#: runs ``train_func`` in a ``TrainingThread`` whose ``except BaseException as e`` calls
#: ``construct_user_exception_with_traceback(e, ...)``; the controller later re-raises it
#: in the driver as a worker-group error, and the worker's own message was in no record.
FRAMEWORK_CATCHES = (
    (
        "ray.train.v2._internal.execution.worker_group.thread_runner",
        "construct_user_exception_with_traceback",
        "ray-train",
    ),
)


def _make_catch(orig: Callable[..., Any], caught_by: str) -> Callable[..., Any]:
    @functools.wraps(orig)
    def caught(exc: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(exc, BaseException) and not isinstance(exc, (SystemExit, KeyboardInterrupt)):
            record_exception(exc, caught_by, thread=threading.current_thread().name)  # (never raises)
        return orig(exc, *args, **kwargs)

    setattr(caught, "__hangtrace_wrapped__", True)
    return caught


def _hook_catch(name: str, caught_by: str) -> Callable[[Any], None]:
    def hook(module: Any) -> None:
        orig = getattr(module, name, None)
        if callable(orig) and not getattr(orig, "__hangtrace_wrapped__", False):
            setattr(module, name, _make_catch(orig, caught_by))

    return hook


#: Post-import hooks: module name -> installer (applied once, when the module is imported).
IMPORT_HOOKS: dict[str, Callable[[Any], None]] = {
    "multiprocessing.process": hook_multiprocessing,
    "asyncio.base_events": hook_asyncio,
    "torch.distributed.elastic.multiprocessing.errors": hook_elastic,
    **{mod: _hook_catch(fn, by) for mod, fn, by in FRAMEWORK_CATCHES},
}


# --- the instrumentor (hooks/instrument.py contract) -------------------------------------
from hangtrace.hooks.instrument import Instrumentor  # noqa: E402


class FailuresInstrumentor(Instrumentor):
    """Failures caught at their source (this module): the exit wrappers of ``lifecycle``
    call :func:`exiting`; this instrumentor points the records at the process's recorder
    and hooks ``multiprocessing.process``, ``asyncio.base_events`` and torchelastic's
    ``errors`` when they are imported (at once when they already are)."""

    name = "failures"

    def _install(self, runtime: Any) -> None:
        from hangtrace.hooks import importhook
        from hangtrace.tracer import api

        configure(lambda: api._recorder, runtime.log)
        for module, hook in IMPORT_HOOKS.items():
            importhook.when_imported(module, hook)

    def _after_fork_child(self) -> None:
        _recorded.clear()  # the child's ring has none of them
