"""Methods of Ray's own infrastructure actors (``config.RAY_INFRA_ACTORS``: the actor behind
``ray.util.queue.Queue``, the stores of ``ray.util.collective``): ``hooks/ray_hooks`` wraps
them with :func:`identity_only`, which records the actor's identity and no phase. Their
calls are their callers' work: a consumer polling a queue with a timeout is no progress,
and the ``Empty`` of a timed get no failed method. Never raises into the method's caller.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any


def _identify(instance: Any) -> None:
    try:
        from hangtrace.hooks.rayhooks import ray_hooks as H

        if "actor" not in H._identity_done and instance is not None and H._current() is not None:
            H.record_identity(instance)
    except Exception:
        pass


def identity_only(method: Any) -> Any:
    """A wrapper of a method of Ray's own infrastructure actors (``config.RAY_INFRA_ACTORS``)
    that records the actor's identity and no phase: its calls are its callers' work."""
    if inspect.iscoroutinefunction(method):

        @functools.wraps(method)
        async def aident(*args: Any, **kwargs: Any) -> Any:
            _identify(args[0] if args else None)
            return await method(*args, **kwargs)

        setattr(aident, "__hangtrace_ray__", True)
        return aident

    @functools.wraps(method)
    def ident(*args: Any, **kwargs: Any) -> Any:
        _identify(args[0] if args else None)
        return method(*args, **kwargs)

    setattr(ident, "__hangtrace_ray__", True)
    return ident
