"""The pending asyncio tasks of this process's running event loops, gathered without the
loops' threads (issue 9, item 2).

``note_loop(loop)`` (from ``failures``' ``BaseEventLoop.create_task`` wrapper: every loop
that ever created a task) keeps a weak reference to the loop. ``write(path)`` is called
by the Flight Recorder agent thread (``hooks/torchdist/fr_agent.py``) when a collector asks for a
dump: for each loop that is running, its pending tasks (``asyncio.all_tasks``, which
copies the task set and retries when another thread changes it), at most
``MAX_TASKS`` per loop, each with:

* ``name``, ``coro`` (the coroutine's qualified name), ``done``;
* ``frames``: its await chain, outermost first, at most ``MAX_FRAMES``: the task's
  coroutine and every coroutine / generator it awaits (``cr_await`` / ``gi_yieldfrom``),
  ``{"func", "file", "line"}`` (the frame's current line);
* ``awaits``: what the task is blocked on (``Task._fut_waiter``): ``{"task": name}`` for
  another task, ``{"future": repr}`` (at most 200 characters) for a plain future, None.

JSON ``{"wall_ns", "pid", "loops": [{"thread_id", "tasks": [...]}]}`` (docs/FORMAT.md),
written atomically; the file is removed when no loop runs. Reading frames of a running
coroutine from another thread is what ``Task.get_stack`` does; the GIL keeps each read
consistent, and a loop that moved on meanwhile gives a slightly older picture. Never raises.
"""

from __future__ import annotations

import os
import weakref
from typing import Any, Dict, List, Optional

MAX_TASKS = 64
MAX_FRAMES = 16
_REPR_MAX = 200

_loops: "weakref.WeakSet[Any]" = weakref.WeakSet()
_last: List[Any] = [None]  # weak reference to the loop noted last: one identity check per task


def note_loop(loop: Any) -> None:
    """Remember ``loop`` (weakly); called for every task created, so the common case (the
    same loop as last time) is one identity check, not a WeakSet lookup. Never raises."""
    try:
        last = _last[0]
        if last is not None and last() is loop:
            return
        _loops.add(loop)
        _last[0] = weakref.ref(loop)
    except Exception:
        pass


def _frame(f: Any) -> Dict[str, Any]:
    co = f.f_code
    return {"func": co.co_name, "file": co.co_filename, "line": f.f_lineno}


def await_chain(coro: Any) -> List[Dict[str, Any]]:
    """The frames of ``coro`` and of what it awaits, outermost first."""
    out: List[Dict[str, Any]] = []
    seen = 0
    while coro is not None and seen < MAX_FRAMES:
        seen += 1
        f = (
            getattr(coro, "cr_frame", None)
            or getattr(coro, "gi_frame", None)
            or getattr(coro, "ag_frame", None)
        )
        if f is not None:
            out.append(_frame(f))
        nxt = getattr(coro, "cr_await", None)
        if nxt is None:
            nxt = getattr(coro, "gi_yieldfrom", None)
        coro = _unwrap(nxt)
    return out


def _is_coro(x: Any) -> bool:
    return any(hasattr(x, a) for a in ("cr_frame", "gi_frame", "ag_frame", "cr_await", "gi_yieldfrom"))


def _unwrap(x: Any) -> Any:
    """``x``, or the coroutine a Cython ``coroutine_wrapper`` (what a Cython coroutine's
    ``cr_await`` gives for ``await coro``: Ray's async actor methods run inside such a
    coroutine, ``_raylet.pyx``) wraps: the one coroutine among its referents (the
    wrapper exposes no attribute for it; ``gc.get_referents`` visits it)."""
    if x is None or _is_coro(x) or type(x).__name__ != "coroutine_wrapper":
        return x
    import gc

    inner = [r for r in gc.get_referents(x) if _is_coro(r)]
    return inner[0] if len(inner) == 1 else x


def _awaits(task: Any) -> Optional[Dict[str, str]]:
    w = getattr(task, "_fut_waiter", None)
    if w is None:
        return None
    get_name = getattr(w, "get_name", None)
    if get_name is not None and hasattr(w, "get_coro"):
        return {"task": str(get_name())}
    return {"future": repr(w)[:_REPR_MAX]}


def _task(t: Any) -> Dict[str, Any]:
    coro = t.get_coro()
    return {
        "name": t.get_name(),
        "coro": getattr(coro, "__qualname__", None) or repr(coro)[:_REPR_MAX],
        "done": t.done(),
        "frames": await_chain(coro),
        "awaits": _awaits(t),
    }


def gather() -> List[Dict[str, Any]]:
    """``[{"thread_id", "tasks"}]`` for every running loop noted. Never raises."""
    import asyncio

    out: List[Dict[str, Any]] = []
    try:
        loops = [lp for lp in list(_loops) if lp.is_running() and not lp.is_closed()]
    except Exception:
        return out
    for lp in loops:
        try:
            tasks = [t for t in asyncio.all_tasks(lp) if not t.done()][:MAX_TASKS]
            out.append(
                {
                    "thread_id": getattr(lp, "_thread_id", None),
                    "tasks": [_task(t) for t in sorted(tasks, key=lambda t: t.get_name())],
                }
            )
        except Exception:
            continue
    return out


def write(path: str) -> bool:
    """Write :func:`gather`'s JSON to ``path`` (removed when no loop runs). True when
    written. Never raises."""
    try:
        import json
        import time

        loops = gather() if _loops else []
        if not loops:
            if os.path.exists(path):
                os.unlink(path)
            return False
        tmp = "%s.%d.tmp" % (path, os.getpid())
        with open(tmp, "w") as f:
            json.dump({"wall_ns": time.time_ns(), "pid": os.getpid(), "loops": loops}, f)
        os.replace(tmp, path)
        return True
    except Exception:
        return False
