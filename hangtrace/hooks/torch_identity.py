"""The identity of the functions ``torch_dist`` installs (split out of ``torch_dist.py``).

In: a wrapper (a plain function or a ``_fastrec.Call``) and the torch function it replaces.
Out: the wrapper carrying that function's name, qualified name, module, docstring and
``__dict__``, marked ``__hangtrace_wrapped__`` = the original; ``wrapped_original`` reads it back.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Dict, Optional, Tuple


def _take_identity(w: Any, orig: Callable[..., Any]) -> Any:
    """Give ``w`` the identity of ``orig`` (name, qualified name, module, docstring, its
    ``__dict__``) and mark it ``__hangtrace_wrapped__ = orig``; returns ``w``.

    For plain functions this is ``functools.update_wrapper`` (which also sets
    ``__wrapped__``); a ``_fastrec.Call`` has a read-only ``__wrapped__`` of its own.
    """
    if isinstance(w, type(_take_identity)):
        functools.update_wrapper(w, orig)
    else:
        for attr in ("__module__", "__name__", "__qualname__", "__doc__"):
            try:
                setattr(w, attr, getattr(orig, attr))
            except AttributeError:
                pass
        w.__dict__.update(getattr(orig, "__dict__", {}))
    w.__hangtrace_wrapped__ = orig
    return w


def _plain_wrapper(orig: Callable[..., Any],
                   wrapper: Callable[[Callable[..., Any], Any, Tuple[Any, ...], Dict[str, Any]], Any]
                   ) -> Callable[..., Any]:
    """``orig`` wrapped by ``wrapper(wrapped, instance, args, kwargs)`` (the batch and group
    operations), as a plain function with ``orig``'s identity."""
    def call(*args: Any, **kwargs: Any) -> Any:
        return wrapper(orig, None, args, kwargs)
    return _take_identity(call, orig)


def wrapped_original(fn: Any) -> Optional[Callable[..., Any]]:
    """The original torch function behind an installed wrapper ``fn``, or None."""
    return getattr(fn, "__hangtrace_wrapped__", None)
