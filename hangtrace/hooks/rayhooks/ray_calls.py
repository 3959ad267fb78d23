"""Ray actor calls, waits on their results, and actor creation requests (issue 9).

The evidence of two verdicts, recorded in the process that calls or creates, so that it
survives the cluster (Ray's state API may be unreachable, or gone when the analysis runs):

* **waits on actor calls** (the wait-for graph across actor calls, rule
  ``actor_waits``): every ``handle.method.remote(...)`` remembers which actor and method
  its ObjectRef comes from (``ActorHandle._actor_method_call``; an in-memory map keyed by
  the ref's id, at most :data:`MAX_REFS` entries, no record written). A ``ray.get`` /
  ``ray.wait`` given at least one such ref writes one ``K_WAIT`` ring record (layout in
  ``tracer/ring/layout.py``): the targets (actor id, class, method) as an interned JSON
  string (written once per distinct text), state 'issued' while it waits, 'completed' or
  'failed' (the exception type) when it returns. A ring slot, not a string-table entry:
  a loop of ``ray.get`` calls costs one 128-byte slot each and never fills the string table.
* **actor creation requests** (rule ``unschedulable``): ``ray_create.py``.

* **awaits on actor calls** (async actors, asyncio drivers): ``await ref``,
  ``asyncio.gather(ref, ...)`` and ``asyncio.wrap_future(ref.future())`` all go through
  ``asyncio.wrap_future`` on the ``concurrent.futures.Future`` of ``ObjectRef.future()``
  (Ray 2.60 ``object_ref.pxi``: ``__await__`` -> ``as_future`` -> ``asyncio.wrap_future``;
  the future keeps its ref in ``fut.object_ref``; ``ObjectRef`` itself is an immutable
  Cython type). The wrapper writes the same ``K_WAIT`` record, api ``'await'``, on the
  thread that awaits (Ray's event-loop thread of the actor), in the phase of the method
  call that awaits (``ray_hooks``' per-task phase stack), and marks it completed / failed
  (the exception's type; ``CancelledError`` when cancelled) from a done callback of the
  asyncio future. ``numel`` holds a per-process await number (0 for ``ray.get`` /
  ``ray.wait``): concurrent awaits of one thread are separate waits
  (``RingSummary.waits``).

Installed by ``ray_install.install_calls``, which sets the recorder function and run log
here (``_rec_fn``, ``_log``; ``ray_create`` writes through them too).

Not seen: refs made in another process and passed in,
``ray.get`` on a task's (not an actor method's) result. Every hook swallows its own
errors (logged once to the run log) and never the program's: the wrapped call's
exceptions and results pass through unchanged.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import threading
import time
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional, Tuple

from hangtrace.tracer.ring import layout as F

#: remembered actor-call refs (oldest dropped first): about 100 bytes each
MAX_REFS = 8192
#: targets written per wait record (the rest counted in "more")
MAX_TARGETS = 8
#: refs of one ray.get / ray.wait looked at
MAX_SCAN = 1024

#: ObjectRef id (bytes) -> (actor id hex, class name, method name)
Target = Tuple[str, str, str]
_refs: "OrderedDict[bytes, Target]" = OrderedDict()
_lock = threading.Lock()
_log: Optional[Callable[..., None]] = None
_rec_fn: Optional[Callable[[], Any]] = None
_await_no = itertools.count(1)


def _say(msg: str, key: str) -> None:
    try:
        if _log is not None:
            _log(msg, key)
    except Exception:
        pass


def _recorder() -> Any:
    return _rec_fn() if _rec_fn is not None else None


# --- calls -------------------------------------------------------------------------------
def note_call(handle: Any, method: str, refs: Any) -> None:
    """Remember that ``refs`` (what ``_actor_method_call`` returned) are results of
    ``method`` of the actor behind ``handle``."""
    try:
        aid = handle._ray_actor_id.hex()
        desc = getattr(handle, "_ray_actor_creation_function_descriptor", None)
        target = (aid, str(getattr(desc, "class_name", "") or ""), str(method))
        items = refs if isinstance(refs, list) else [refs]
        with _lock:
            for r in items:
                binary = getattr(r, "binary", None)
                if binary is None:
                    continue  # ObjectRefGenerator (streaming), None
                _refs[binary()] = target
                while len(_refs) > MAX_REFS:
                    _refs.popitem(last=False)
    except Exception as e:
        _say("ray: noting an actor call failed: %r" % (e,), "ray-call")


def targets_of(refs: Any) -> Tuple[List[Target], int]:
    """The distinct actor-call targets among ``refs`` (one ref or a sequence), in order,
    and the number of refs looked at."""
    items = (
        [refs]
        if hasattr(refs, "binary")
        else list(refs)[:MAX_SCAN]
        if isinstance(refs, (list, tuple))
        else []
    )
    out: List[Target] = []
    seen = set()
    for r in items:
        binary = getattr(r, "binary", None)
        t = _refs.get(binary()) if binary is not None else None
        if t is not None and t not in seen:
            seen.add(t)
            out.append(t)
    return out, len(items)


def wait_text(api: str, targets: List[Target], n: int) -> str:
    """The JSON text of a wait record (``layout.K_WAIT``)."""
    d: Dict[str, Any] = {
        "api": api,
        "n": n,
        "targets": [{"actor_id": a, "class": c, "method": m} for a, c, m in targets[:MAX_TARGETS]],
    }
    if len(targets) > MAX_TARGETS:
        d["more"] = len(targets) - MAX_TARGETS
    return json.dumps(d, sort_keys=True)


def _wait_begin(api: str, refs: Any) -> Tuple[Any, int]:
    """Write the wait record when ``refs`` hold actor-call results: (recorder, idx) or (None, 0)."""
    try:
        rec = _recorder()
        if rec is None or not _refs:
            return None, 0
        targets, n = targets_of(refs)
        if not targets:
            return None, 0
        if rec.full_slots and not getattr(rec, "library_actor", False):  # a driver waiting on actors
            rec.grow("waits on Ray actor calls")  # is part of the job: the full ring
        sid = rec.intern(wait_text(api, targets, n))
        return rec, rec._slot(F.K_WAIT, 0, sid, n, 0, 0, 0, -1, F.S_ISSUED)
    except Exception as e:
        _say("ray: recording a wait failed: %r" % (e,), "ray-wait")
        return None, 0


def _wait_end(rec: Any, idx: int, exc: Optional[BaseException]) -> None:
    """Mark wait record ``idx`` completed (or failed with the exception's type) in place,
    unless newer records overwrote its slot."""
    if rec is None or not idx:
        return
    try:
        nslots = rec.nslots
        if rec._last - idx >= nslots:
            return
        err = rec.intern(type(exc).__name__) if exc is not None else 0
        F.COMPLETE.pack_into(
            rec.mm,
            F.HEADER_SIZE + ((idx - 1) % nslots) * F.SLOT_SIZE + F.COMPLETE_OFF,
            F.S_FAILED if exc is not None else F.S_COMPLETED,
            err,
            time.monotonic_ns(),
        )
    except Exception as e:
        _say("ray: recording the end of a wait failed: %r" % (e,), "ray-wait-end")


def _wrap_waiting(api: str, orig: Any) -> Any:
    @functools.wraps(orig)
    def waiting(*args: Any, **kwargs: Any) -> Any:
        refs = args[0] if args else kwargs.get("object_refs", kwargs.get("ray_waitables"))
        rec, idx = _wait_begin(api, refs)
        try:
            out = orig(*args, **kwargs)
        except BaseException as e:
            _wait_end(rec, idx, e)
            raise
        _wait_end(rec, idx, None)
        return out

    setattr(waiting, "__hangtrace_ray__", True)
    return waiting


def _task_phase() -> None:
    """Make the awaiting asyncio task's method the thread's current phase (async actors)."""
    try:
        from hangtrace.hooks.rayhooks import ray_hooks

        if ray_hooks._task_stack.get() is not None:
            ray_hooks._swap_task_stack()
    except Exception:
        pass


def _await_begin(fut: Any) -> Tuple[Any, int]:
    """Write the wait record of an await on ``fut`` (``ObjectRef.future()``) when its ref is
    an actor-call result: (recorder, idx) or (None, 0)."""
    try:
        ref = getattr(fut, "object_ref", None)
        rec = _recorder()
        if ref is None or rec is None or not _refs:
            return None, 0
        targets, n = targets_of(ref)
        if not targets:
            return None, 0
        if rec.full_slots and not getattr(rec, "library_actor", False):
            rec.grow("waits on Ray actor calls")
        _task_phase()
        sid = rec.intern(wait_text("await", targets, n))
        return rec, rec._slot(F.K_WAIT, 0, sid, n, next(_await_no), 0, 0, -1, F.S_ISSUED)
    except Exception as e:
        _say("ray: recording an await failed: %r" % (e,), "ray-await")
        return None, 0


def _await_done(rec: Any, idx: int, afut: Any) -> None:
    """Done callback of the awaited asyncio future: end wait record ``idx``. Reads the
    exception without retrieving it (asyncio's 'never retrieved' logging is unchanged)."""
    try:
        exc = asyncio.CancelledError() if afut.cancelled() else getattr(afut, "_exception", None)
        _wait_end(rec, idx, exc)
    except Exception as e:
        _say("ray: recording the end of an await failed: %r" % (e,), "ray-await-end")


def _wrap_future(orig: Any) -> Any:
    @functools.wraps(orig)
    def wrap_future(future: Any, *args: Any, **kwargs: Any) -> Any:
        out = orig(future, *args, **kwargs)
        if getattr(future, "object_ref", None) is not None:
            rec, idx = _await_begin(future)
            if rec is not None:
                try:
                    out.add_done_callback(functools.partial(_await_done, rec, idx))
                except Exception as e:
                    _say("ray: watching an await failed: %r" % (e,), "ray-await-cb")
        return out

    setattr(wrap_future, "__hangtrace_ray__", True)
    return wrap_future
