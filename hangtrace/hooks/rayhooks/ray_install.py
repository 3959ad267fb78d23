"""Installing the Ray hooks in a process that imports Ray (from ``hooks/libraries.py``):
the actor-method phases and worker identity of ``ray_hooks`` (``install``: by the
'executor' or 'class' path, version-gated, ``HANGTRACE_RAY_HOOK`` forcing one; see
``ray_hooks``' docstring) and the actor calls, waits, awaits and creation requests of
``ray_calls`` and ``ray_create`` (``install_calls``). In: the imported ``ray`` module, the
recorder (or the function returning the current one) and the run log; out: Ray's
attributes replaced by our wrappers (restored by ``uninstall``/``uninstall_calls``), the
hook path in the ring's meta, and the identity thread started.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

from hangtrace.hooks.rayhooks import ray_calls as RC
from hangtrace.hooks.rayhooks import ray_create as RCR
from hangtrace.hooks.rayhooks import ray_hooks as H
from hangtrace.tracer import config

HOOK_ENV = config.RAY_HOOK
#: Ray versions whose internals the 'executor' and 'class' paths were written against
#: (lower bound inclusive, upper exclusive). Checked on 2.60.0.
RAY_RANGE = ((2, 0), (3, 0))

_path: Optional[str] = None  # the hook path taken by install, None before it ran
_installed: Dict[Tuple[int, str], Tuple[Any, str, Any]] = {}  # (owner, attribute) -> original
_calls_installed: List[Tuple[Any, str, Any]] = []  # install_calls': (owner, attribute, original)


def _version_tuple(v: Any) -> Tuple[int, ...]:
    """(major, minor, patch) of a version string; digits before any suffix ('2.60.0rc1')."""
    import re

    nums = [int(m.group(0)) if m else 0 for m in (re.match(r"\d+", p) for p in str(v).split(".")[:3])]
    return tuple(nums + [0] * (3 - len(nums)))


def _in_range(version: Any) -> bool:
    v = _version_tuple(version)[:2]
    return RAY_RANGE[0] <= v < RAY_RANGE[1]


def _patch(owner: Any, attr: str, make: Callable[[Any], Any]) -> bool:
    key = (id(owner), attr)
    if key in _installed:
        return True
    orig = getattr(owner, attr, None)
    if orig is None:
        return False
    setattr(owner, attr, make(orig))
    _installed[key] = (owner, attr, orig)
    return True


def _install_executor(fm: Any) -> bool:
    cls = fm.FunctionActorManager
    orig = getattr(cls, "_make_actor_method_executor", None)
    if orig is None:
        return False
    params = list(inspect.signature(orig).parameters)
    if params[:3] != ["self", "method_name", "method"]:
        H._log("ray: _make_actor_method_executor has parameters %r; not hooked" % (params,), "ray-sig")
        return False

    def make(orig: Any) -> Any:
        @functools.wraps(orig)
        def _make_actor_method_executor(
            self: Any, method_name: str, method: Any, *args: Any, **kwargs: Any
        ) -> Any:
            return orig(self, method_name, H.wrap_method(method_name, method), *args, **kwargs)

        return _make_actor_method_executor

    return _patch(cls, "_make_actor_method_executor", make)


def _install_class(fm: Any) -> bool:
    cls = fm.FunctionActorManager
    names = [n for n in ("_load_actor_class_from_gcs", "_load_actor_class_from_local") if hasattr(cls, n)]
    if not names:
        return False

    def make(orig: Any) -> Any:
        @functools.wraps(orig)
        def loader(self: Any, *args: Any, **kwargs: Any) -> Any:
            klass = orig(self, *args, **kwargs)
            if klass is not None:
                try:
                    H.instrument_class(klass)
                except Exception as e:
                    H._log("ray: instrumenting actor class failed: %r" % (e,), "ray-class")
            return klass

        return loader

    for n in names:
        _patch(cls, n, make)
    return True


def _identity_thread() -> None:
    """Poll (every 0.1 s, up to 60 s) until this process is connected to Ray, then record
    the worker-level identity (task workers, idle workers, actors before their first
    method, the identity-only path)."""
    import time

    def run() -> None:
        for _ in range(600):
            time.sleep(0.1)
            try:
                import ray

                if "actor" in H._identity_done or "name" in H._identity_done:
                    return
                if not ray.is_initialized():
                    continue
                if "worker" not in H._identity_done:
                    H.record_identity()
                if "worker" in H._identity_done and H._self_handle_registered():
                    # an actor whose methods are not hooked (identity-only): its name
                    if H.record_identity(force=True, with_name=True) is not None:
                        H._identity_done.add("name")
                    return
            except Exception:
                pass

    threading.Thread(target=run, name="hangtrace-ray-identity", daemon=True).start()


def install(ray: Any, recorder: Any, log: Callable[..., None]) -> str:
    """Hook Ray in this process (``ray`` is the imported module). Idempotent.

    Returns the hook path taken: 'executor', 'class' or 'identity-only'.
    """
    global _path
    if _path is not None:
        return _path
    H._rec, H._log = recorder, log
    version, want, path = (
        getattr(ray, "__version__", "0"),
        os.environ.get(HOOK_ENV, "").strip().lower(),
        "identity-only",
    )
    fm: Any  # Ray's private function_manager module, or None
    try:
        from ray._private import function_manager as fm
    except Exception as e:
        fm = None
        log("ray: function_manager not importable (%r): no actor method phases" % (e,), "ray-fm")
    if fm is not None and want != "off":
        if not _in_range(version):
            log(
                "ray %s is outside the tested range %s-%s: no actor method phases" % (version, *RAY_RANGE),
                "ray-version",
            )
        else:
            try:
                if want != "class" and _install_executor(fm):
                    path = "executor"
                elif _install_class(fm):
                    path = "class"
            except Exception as e:
                log("ray: hooking actor methods failed: %r" % (e,), "ray-hook")
    _path = path
    try:
        recorder.set_meta(ray_pid=os.getpid(), ray_version=version, ray_hook_path=path)
    except Exception as e:
        log("ray: meta not recorded: %r" % (e,), "ray-meta")
    _identity_thread()
    return path


def uninstall() -> None:
    """Restore every patched attribute (tests)."""
    global _path
    for owner, attr, orig in list(_installed.values()):
        setattr(owner, attr, orig)
    _installed.clear()
    _path = None


def hook_path() -> Optional[str]:
    """The path taken by ``install`` in this process, or None before it ran."""
    return _path


def _patch_call(owner: Any, attr: str, make: Callable[[Any], Any]) -> bool:
    orig = getattr(owner, attr, None)
    if orig is None or getattr(orig, "__hangtrace_ray__", False):
        return False
    setattr(owner, attr, make(orig))
    _calls_installed.append((owner, attr, orig))
    return True


def install_calls(ray: Any, recorder_fn: Callable[[], Any], log: Callable[..., None]) -> int:
    """Hook actor calls, ``ray.get`` / ``ray.wait``, ``asyncio.wrap_future`` (awaits) and actor creation in this process
    (``ray``: the imported module; ``recorder_fn``: returns the current recorder). Returns
    the number of attributes hooked (0 when already installed or nothing matched)."""
    if _calls_installed:
        return 0
    RC._log, RC._rec_fn = log, recorder_fn
    from ray import actor as ray_actor
    from ray._private import worker as ray_worker

    def make_call(orig: Any) -> Any:
        @functools.wraps(orig)
        def _actor_method_call(self: Any, method_name: str, *args: Any, **kwargs: Any) -> Any:
            refs = orig(self, method_name, *args, **kwargs)
            RC.note_call(self, method_name, refs)
            return refs

        setattr(_actor_method_call, "__hangtrace_ray__", True)
        return _actor_method_call

    def make_create(orig: Any) -> Any:
        @functools.wraps(orig)
        def _remote(self: Any, args: Any = None, kwargs: Any = None, **actor_options: Any) -> Any:
            handle = orig(self, args, kwargs, **actor_options)
            RCR.note_create(ray, self, handle, actor_options)
            return handle

        setattr(_remote, "__hangtrace_ray__", True)
        return _remote

    n = int(_patch_call(ray_actor.ActorHandle, "_actor_method_call", make_call))
    n += int(_patch_call(ray_actor.ActorClass, "_remote", make_create))
    for api in ("get", "wait"):
        # ray.get is Ray's auto-init wrapper around ray._private.worker.get (a closure
        # over the original): each is wrapped on its own, a call goes through one of them
        for owner in (ray, ray_worker):
            n += int(_patch_call(owner, api, functools.partial(RC._wrap_waiting, api)))
    # await ref: Cython's ObjectRef.as_future looks asyncio.wrap_future up at each call
    n += int(_patch_call(asyncio, "wrap_future", RC._wrap_future))
    return n


def uninstall_calls() -> None:
    """Restore every attribute ``install_calls`` patched and forget the remembered refs (tests)."""
    for owner, attr, orig in reversed(_calls_installed):
        setattr(owner, attr, orig)
    _calls_installed.clear()
    RC._refs.clear()
    RCR._creates, RCR._nodes = 0, None
