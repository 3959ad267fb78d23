"""Which frames are the user's own code (pure).

In: one frame of the thread format (``stackmodel/threads.py``; a traceback's frames have
the same keys). Out: whether it is a call-forwarding wrapper that says nothing about the
program (:func:`wrapper_frame`: hangtrace's hooks, torch's c10d logging decorators, Ray's
tracing helper), whether it is the user's own code (:func:`user_code`: not an installed
package, the standard library or a wrapper), and the innermost such frame of a stack
(:func:`user_frame`). Used by collection (``collect/sourcelines.py``: which lines to read)
and by the analysis (the culprit's line).
"""

from __future__ import annotations

from typing import Any, List, Mapping, Optional, Tuple


def wrapper_frame(f: Mapping[str, Any]) -> bool:
    """True for call-forwarding wrappers that say nothing about the program: hangtrace's
    own hooks (``hangtrace/hooks/*.py``) and torch's c10d logging decorators
    (``torch/distributed/c10d_logger.py``: ``_exception_logger``/``_time_logger``)."""
    fn = (f.get("filename") or "").replace("\\", "/")
    if "/hangtrace/hooks/" in fn:
        return True
    if fn.endswith("ray/util/tracing/tracing_helper.py"):  # Ray's actor-method span wrapper (issue 4)
        return True
    return fn.endswith("torch/distributed/c10d_logger.py") and "wrapper" in (f.get("name") or "")


#: Path fragments of frames that are not the user's code: installed packages (torch,
#: Ray, numpy), the standard library, frozen importlib.
LIBRARY_PATHS = ("site-packages", "dist-packages", "/lib/python", "<frozen")


def user_code(f: Any) -> bool:
    """Is frame ``f`` the user's own code (not a library's: ``LIBRARY_PATHS``, not one of
    our hooks' wrappers)?"""
    fn = str((f or {}).get("filename") or "")
    return bool(fn) and not any(x in fn for x in LIBRARY_PATHS) and not wrapper_frame(f)


def user_frame(frames: List[Any]) -> Optional[Any]:
    """The innermost frame of the user's own code (not a library's: ``LIBRARY_PATHS``),
    or None. For a collective issued from inside torch (DDP's reducer in backward, FSDP's
    hooks, DTensor) the innermost frames are torch's; this is the line that led there."""
    return next((f for f in frames if user_code(f)), None)


def user_call(frames: List[Any]) -> Optional[Tuple[int, Optional[int]]]:
    """Where the user's code is in a stack (``frames`` innermost first, wrappers included
    or not): ``(i, j)`` with ``i`` the index of the innermost frame of the user's own code
    and ``j`` the index of the frame it called (the library call it made: ``Queue.get``,
    ``all_reduce``, ``Trainer.fit``; call-forwarding wrappers skipped), or ``j`` None when
    the user's frame is the innermost one. None when no frame is the user's (issue 41)."""
    i = next((k for k, f in enumerate(frames) if user_code(f)), None)
    if i is None:
        return None
    j = next((k for k in range(i - 1, -1, -1) if not wrapper_frame(frames[k])), None)
    return i, j
