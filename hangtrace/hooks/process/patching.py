"""Replacing a module's function by a pass-through that calls our wrapper, and putting it
back: in, (module, name, ``wrapper(original, None, args, kwargs)``); out, the module's
attribute replaced once (``patch``) and every replacement undone (``unpatch``). Used by
``lifecycle`` for ``sys.exit``, ``os._exit``, the excepthooks, ``signal.signal`` and
``threading._shutdown``.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, List, Tuple

Wrapper = Callable[[Any, Any, tuple, dict], Any]

_patched: List[Tuple[Any, str, Any]] = []  # (module, name, original) in patch order


def patch(module: Any, name: str, wrapper: Wrapper) -> None:
    """Replace ``module.name`` by a pass-through function that calls
    ``wrapper(original, None, args, kwargs)``; once (a marked function is left alone).

    Plain closures, not ``wrapt``: importing wrapt at start-up costs tens of ms here.
    """
    cur = getattr(module, name)
    if getattr(cur, "__hangtrace_wrapped__", None) is not None:
        return

    @functools.wraps(cur)
    def patched(*args: Any, **kwargs: Any) -> Any:
        return wrapper(cur, None, args, kwargs)

    patched.__hangtrace_wrapped__ = cur  # type: ignore[attr-defined]
    setattr(module, name, patched)
    _patched.append((module, name, cur))


def unpatch() -> None:
    """Put back every function ``patch`` replaced (only where ours is still in place)."""
    for module, name, orig in reversed(_patched):
        if getattr(getattr(module, name, None), "__hangtrace_wrapped__", None) is orig:
            setattr(module, name, orig)
    del _patched[:]
