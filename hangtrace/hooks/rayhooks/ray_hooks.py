"""Ray worker-side hooks: identity of the traced Ray worker and actor-method phases.

Installed (``ray_install.install``) by the post-import hook on ``ray`` (``libraries.RayInstrumentor``) in every traced process
that imports Ray: Ray workers started with ``HANGTRACE=1`` in their ``runtime_env`` env_vars run
the ``.pth`` at interpreter start (checked on Ray 2.60: ``default_worker.py`` imports ray, our
hook runs, then the worker connects), the driver too when it is traced.

What it records (``Recorder.set_meta``, read back as ``ProcessInfo.meta``; docs/RAY.md
section 2): ``ray_pid``, ``ray_version``, ``ray_hook_path`` at install; job, node, worker
and actor ids and the namespace once the worker is connected (a daemon thread polls
``ray.is_initialized()``) and at the first actor method; ``ray_actor_name`` and
``ray_actor_class`` at the first actor method only (see ``record_identity``).

Every actor method execution (``__init__`` included, Ray's own ``__ray_*`` methods
excluded) is recorded as a phase named after the method: a phase-enter record at start,
a phase-exit record at the end (failed, with ``Type: message``, when it raises). Phases
the method's own code opens (``tracer.phase``) nest inside it and are the current phase
while open, so an explicit phase always wins. Plain, threaded (``max_concurrency > 1``;
Ray runs each call on a pool thread: phases are per thread) and async actors (the
wrapper is itself ``async def``, so Ray still sees a coroutine function) are covered.
Class methods, generator and async-generator methods (streaming) are left unwrapped.
Ray's own infrastructure actors (``config.RAY_INFRA_ACTORS``): identity only (``ray_infra``).

How methods are reached (Ray internals, version-gated; the path taken is recorded in
``meta['ray_hook_path']``): ``'executor'`` (we hand ``FunctionActorManager.
_make_actor_method_executor`` our wrapper of each method), ``'class'`` (the loaded actor
class instrumented in place) or ``'identity-only'``; docs/RAY.md section 3 gives the
internals, the Ray 2.60 source and the gates. ``HANGTRACE_RAY_HOOK`` (``executor`` |
``class`` | ``off``) forces a path.

Async actors: coroutines of one actor share the event-loop thread, whose phase stack
the recorder keys by thread. The wrapper keeps one stack per asyncio task (a
``contextvars.ContextVar``) and installs it as the thread's stack around its own
enter/exit records, so each method's exit record names the right method; between
those points the thread's current phase is the most recently entered or exited method.

Never raises into Ray or the program: every failure is logged once to the run log and
the method runs unwrapped.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import os
import threading
from typing import Any, Dict, List, Optional, Set, Tuple

from hangtrace.hooks.record.ringsize import ray_library_actor
from hangtrace.tracer import api, config

_rec: Any = None
_log: Any = None
_identity_done: Set[str] = set()  # levels recorded: 'worker', 'actor', 'name'
_id_lock = threading.Lock()
_task_stack: contextvars.ContextVar[Optional[List[Tuple[int, str]]]] = contextvars.ContextVar(
    "hangtrace_ray_phase_stack", default=None
)


# --- identity ------------------------------------------------------------------------------
def _self_handle_registered() -> bool:
    """True once this worker's actor object exists, i.e. once calling ``get_actor_name()``
    is safe: Ray's ``execute_task`` stores the actor object in ``global_worker.actors``
    only after ``CoreWorker::ExecuteTask`` registered the actor's own handle (Ray 2.x).
    False for task workers and on any surprise."""
    try:
        import ray

        acts = getattr(ray._private.worker.global_worker, "actors", None)
        return isinstance(acts, dict) and len(acts) > 0
    except Exception:
        return False


def record_identity(
    instance: Any = None, force: bool = False, with_name: bool = False
) -> Optional[Dict[str, Any]]:
    """Record the Ray identity of this worker in the ring; returns the dict recorded or None.

    Two levels, each recorded once (unless ``force``): the worker (job, node, worker,
    actor id and name - from the public ``ray.get_runtime_context()``, once the worker is
    connected) and, with ``instance`` (the actor object), the actor class. Meta entries
    merge, so the order of the two does not matter.
    """
    rec = _current()
    level = "actor" if instance is not None else "worker"
    if rec is None or (level in _identity_done and not force):
        return None
    with _id_lock:
        if level in _identity_done and not force:
            return None
        meta = {}
        try:
            import ray

            ctx = ray.get_runtime_context()
            getters = [
                ("ray_job_id", "get_job_id"),
                ("ray_node_id", "get_node_id"),
                ("ray_worker_id", "get_worker_id"),
                ("ray_actor_id", "get_actor_id"),
            ]
            if instance is not None or with_name:
                # Only from an actor method or once _self_handle_registered(): Ray sets
                # the worker's actor id before it registers the actor's own handle
                # (CoreWorker::ExecuteTask, Ray 2.60), and get_actor_name() in that
                # window fails a RAY_CHECK and aborts the worker.
                getters.append(("ray_actor_name", "get_actor_name"))
            for key, fn in getters:
                try:
                    meta[key] = getattr(ctx, fn)()
                except Exception:
                    meta[key] = None
            try:
                meta["ray_namespace"] = ctx.namespace
            except Exception:
                pass
        except Exception as e:
            _log("ray identity failed: %r" % (e,), "ray-identity")
        if instance is not None:
            cls = type(instance)
            meta["ray_actor_class"] = cls.__name__
            meta["ray_actor_module"] = getattr(cls, "__module__", None)
        elif not meta.get("ray_job_id") and not meta.get("ray_actor_id"):
            return None  # not connected yet
        if not meta.get("ray_actor_id"):
            meta.pop("ray_actor_name", None)
        meta["ray_pid"] = os.getpid()
        meta = {k: v for k, v in meta.items() if v is not None}
        try:
            rec.set_meta(**meta)
        except Exception as e:
            _log("ray identity not recorded: %r" % (e,), "ray-identity-meta")
            return None
        _identity_done.add(level)
        if instance is not None and meta.get("ray_job_id"):
            _identity_done.add("worker")
        return meta


# --- phases ---------------------------------------------------------------------------------
def _current() -> Any:
    """This process's recorder (the public API's: replaced in a forked child)."""
    return api._recorder or _rec


def _enter(name: str, instance: Any) -> None:
    rec = _current()
    if rec is None:
        return
    try:
        if "actor" not in _identity_done and instance is not None and record_identity(instance) is not None:
            from hangtrace.hooks.torchdist import (
                fr_agent,
            )  # an actor answers snapshot requests as a rank does

            fr_agent.start(rec.run_dir, _log)  # (its asyncio tasks; never raises)
        rec.phase_enter(name, grow=not _library_actor(instance))
    except Exception as e:
        _log("recording actor method start failed: %r" % (e,), "ray-enter")


def _library_actor(instance: Any) -> bool:
    """An actor of Ray's own library (``ringsize.ray_library_actor``): its method calls keep
    a small ring small."""
    return instance is not None and ray_library_actor(getattr(type(instance), "__module__", None))


def _exit(name: str, exc: Optional[BaseException]) -> None:
    rec = _current()
    if rec is None:
        return
    try:
        rec.phase_exit(name, None if exc is None else "%s: %s" % (type(exc).__name__, exc))
    except Exception as e:
        _log("recording actor method end failed: %r" % (e,), "ray-exit")


def _swap_task_stack() -> None:
    """Install this asyncio task's phase stack as the thread's stack in the recorder."""
    rec = _current()
    phases = getattr(rec, "_phase", None)
    if not isinstance(phases, dict):
        return
    st = _task_stack.get()
    if st is None:
        st = []  # (phase strid, name) of the task's open phases
        _task_stack.set(st)
    phases[threading.get_ident()] = st


def wrap_method(name: str, method: Any) -> Any:
    """Return a wrapper of actor method ``method`` that records phase ``name``.

    Returns ``method`` itself when it must not be wrapped (Ray internals, class methods,
    generators, already wrapped). The wrapper passes arguments, return value and
    exceptions through unchanged.
    """
    try:
        if (
            name.startswith("__ray")
            or not inspect.isfunction(method)
            or getattr(method, "__hangtrace_ray__", False)
            or inspect.isgeneratorfunction(method)
            or inspect.isasyncgenfunction(method)
        ):
            return method
        if config.ray_infra_actor(method.__module__, method.__qualname__.split(".")[0]):
            return __import__("hangtrace.hooks.rayhooks.ray_infra", fromlist=["_"]).identity_only(method)
        if inspect.iscoroutinefunction(method):

            @functools.wraps(method)
            async def awrapper(*args: Any, **kwargs: Any) -> Any:
                _swap_task_stack()
                _enter(name, args[0] if args else None)
                try:
                    result = await method(*args, **kwargs)
                except BaseException as e:
                    _swap_task_stack()
                    _exit(name, e)
                    raise
                _swap_task_stack()
                _exit(name, None)
                return result

            setattr(awrapper, "__hangtrace_ray__", True)  # (once per method, not per call)
            return awrapper

        @functools.wraps(method)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            _enter(name, args[0] if args else None)
            try:
                result = method(*args, **kwargs)
            except BaseException as e:
                _exit(name, e)
                raise
            _exit(name, None)
            return result

        setattr(wrapper, "__hangtrace_ray__", True)
        return wrapper
    except Exception as e:
        if _log:
            _log("wrapping actor method %s failed: %r" % (name, e), "ray-wrap")
        return method


def instrument_class(cls: type) -> int:
    """Replace the functions of actor class ``cls`` by phase-recording wrappers, in place.

    Used by the 'class' path. Inherited methods are wrapped on ``cls`` itself; static
    methods stay static; class methods, dunders other than ``__init__`` and Ray's
    ``__ray_*`` methods are untouched. Returns the number of methods wrapped.
    """
    n = 0
    for attr in dir(cls):
        if attr.startswith("__ray") or (attr.startswith("__") and attr != "__init__"):
            continue
        try:
            raw = inspect.getattr_static(cls, attr)
        except AttributeError:
            continue
        is_static = isinstance(raw, staticmethod)
        fn = raw.__func__ if is_static else raw
        if not inspect.isfunction(fn):
            continue
        w = wrap_method(attr, fn)
        if w is fn:
            continue
        try:
            setattr(cls, attr, staticmethod(w) if is_static else w)
            n += 1
        except (AttributeError, TypeError):
            pass
    return n
