"""Public phase API: ``phase(name, step=None)``, ``step(n)``, ``heartbeat()``,
``gauge(name, fn, limit=None)`` (memory the tool cannot see, issue 5).

Phase entry/exit and steps also take a memory sample when memory sampling is on
(``hooks/mem/sampler.py``; ``HANGTRACE_MEM=0`` turns it off). A step's sample is skipped when
another was taken less than ``STEP_SAMPLE_GAP_NS`` before (a ``with phase(...)`` just left
or entered beside ``step(n)``: the same figures, issue 13); the next sample carries the
new step. On the one-call path below, a phase entered within that gap of the newest host
sample repeats that sample's RSS, usage and oom_kill figures in its entry sample instead of
reading them again (``Ring.phase_in``); exit samples always read.

Once the process's ring is full-size and its memory sampler runs on its timer with host
figures only, each boundary is one C call of the ring (``_bind``: records and sample
together, the same records as the Python path; issue 13). Anything else (a helper's
small ring, CUDA or gauge samples, the deep trace, a phase left by an exception) takes
the Python path.

Free no-ops when tracing is off (no recorder installed): ``phase()`` then returns one
shared do-nothing object. Imported in every traced process: standard library only.
"""

from __future__ import annotations

import functools
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, Literal, Optional, Tuple, TypeVar, Union

if TYPE_CHECKING:
    from hangtrace.hooks.deep import DeepTracer

F = TypeVar("F", bound=Callable[..., Any])

_recorder: Any = None  # set by hangtrace.hooks.bootstrap when tracing is on
_mono = time.monotonic_ns
#: ns: a step's memory sample is skipped, and a phase's entry sample repeats the newest one's
#: figures (one-call path), when that sample is younger than this (module doc)
STEP_SAMPLE_GAP_NS = 1_000_000


def _set_recorder(rec: Any) -> None:
    global _recorder
    _recorder = rec
    _unbind()


# --- the one-call path (issue 13): the C Ring's phase_in / phase_out / step_to ---
_fast: Any = None  # the recorder's C Ring while the one-call path is bound, else None
_mem: Optional[Tuple[int, ...]] = None  # its memory sample's figures (Sampler.fast_args), None: no sample
_gen = 0  # bumped by every _unbind (no lock: _unbind runs in forked children and on the sampler's thread)


def _unbind() -> None:
    """Back to the Python path (a new recorder, ring or sampler, a gauge, CUDA, the deep
    trace, new swap/limit figures): the next call through it binds again when it can."""
    global _fast, _mem, _gen
    _gen += 1
    _fast = _mem = None


def _bind() -> None:
    """After a call through the Python path: take the one-call path when this process's
    ring is the C Ring at full size and the sampler (if any) samples host figures only.
    An _unbind on another thread meanwhile wins (checked after the assignment). Never raises."""
    global _fast, _mem
    rec = _recorder
    if rec is None or _deep is not None or getattr(rec, "full_slots", True) or getattr(rec, "lazy", True):
        return
    try:
        g = _gen
        ring = rec.__dict__.get("_fast")
        if ring is None or not hasattr(ring, "step_to"):
            return
        s = _sampler
        mem = None
        if s is not None:
            mem = s.fast_args(ring)
            if mem is None:
                return
        _fast, _mem = ring, mem
        if g != _gen:
            _fast = _mem = None
    except Exception as e:
        _report(e)


# --- memory (issue 5): the sampler (hooks/mem/sampler.py) and the gauges it reads ---
_sampler: Any = None  # set by hangtrace.hooks.mem.memory when memory sampling is on
_gauges: Dict[
    str, Tuple[Callable[[], Any], Optional[int]]
] = {}  # name -> (fn, limit bytes or None); read by the sampler


def _set_sampler(sampler: Any) -> None:
    global _sampler
    _sampler = sampler
    _unbind()


def gauge(
    name: str, fn: Optional[Callable[[], Union[int, Tuple[int, int]]]], limit: Optional[int] = None
) -> None:
    """Register memory hangtrace cannot see itself (an inference engine's KV pool, a
    pinned-host cache, ...), sampled like host and CUDA memory: at every phase entry and
    exit, every step and on the timer, into this process's flight record.

    ``name``: str (recorded as ``gauge:<name>``); ``fn()``: returns the bytes in use (int),
    or ``(bytes, limit_bytes)``; ``limit``: the budget in bytes (int) when ``fn`` returns
    only bytes, for "peak vs limit" and the projected step at which it is reached.
    Registering a name again replaces it; ``fn=None`` removes it. ``fn`` runs on the
    caller's thread at phase boundaries and on the sampler thread; it must be cheap and
    thread-safe; its exceptions are swallowed (logged once). A free no-op when tracing is
    off; never raises.
    """
    if _recorder is None:
        return
    try:
        if fn is None:
            _gauges.pop(str(name), None)
        else:
            _gauges[str(name)] = (fn, int(limit) if limit else None)
    except Exception as e:
        _report(e)
    _unbind()  # (gauges are sampled by the Python path)


# --- end memory ---


# --- deep trace (issue 11): set by hangtrace.hooks.deep only when HANGTRACE_DEEP is set ---
_deep: Optional[DeepTracer] = None


def _set_deep(deep: Optional[DeepTracer]) -> None:
    global _deep
    _deep = deep
    _unbind()


# --- end deep trace ---


def _report(e: BaseException) -> None:
    rec = _recorder
    try:
        if rec is not None:
            rec.log("phase API error: %r" % (e,), "api-" + type(e).__name__)
    except Exception:
        pass


class _Phase:
    """Context manager and decorator that records entering and leaving a phase."""

    __slots__ = ("name", "step")

    def __init__(self, name: str, step: Optional[int] = None) -> None:
        self.name = str(name)
        self.step = step

    def __enter__(self) -> "_Phase":
        rec = _recorder
        if rec is not None:
            f = _fast
            if f is not None:
                try:
                    f.phase_in(self.name, self.step, _mem, STEP_SAMPLE_GAP_NS)
                except Exception as e:
                    _report(e)
                return self
            try:
                rec.phase_enter(self.name, self.step)
            except Exception as e:
                _report(e)
            s = _sampler
            if s is not None:
                s.sample(2)  # MEM_ENTER; never raises
            d = _deep
            if d is not None:
                d.phase_enter(self.name)  # never raises
            _bind()
        return self

    def __exit__(self, etype: Any, evalue: Any, tb: Any) -> Literal[False]:
        rec = _recorder
        if rec is not None:
            f = _fast
            if f is not None and etype is None:
                try:
                    f.phase_out(self.name, _mem)
                except Exception as e:
                    _report(e)
                return False
            d = _deep
            if d is not None:
                d.phase_exit(self.name)  # never raises
            s = _sampler
            if s is not None:
                if etype is not None:
                    s.on_exception(etype, evalue)  # an OOM error leaving a phase: MEM_OOM sample
                s.sample(3)  # MEM_EXIT; never raises
            try:
                rec.phase_exit(self.name, None if etype is None else "%s: %s" % (etype.__name__, evalue))
            except Exception as e:
                _report(e)
        return False

    def __call__(self, fn: F) -> F:
        name, step = self.name, self.step

        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            with _Phase(name, step):
                return fn(*args, **kwargs)

        return inner  # type: ignore[return-value]


class _NoPhase:
    __slots__ = ()

    def __enter__(self) -> "_NoPhase":
        return self

    def __exit__(self, *exc: Any) -> Literal[False]:
        return False

    def __call__(self, fn: F) -> F:
        return fn


_NO_PHASE = _NoPhase()


def phase(name: str, step: Optional[int] = None) -> Union[_Phase, _NoPhase]:
    """Mark a phase of the program (``rollout``, ``train``, ``checkpoint`` ...).

    Use as ``with phase("train", step=3):`` or as a decorator ``@phase("eval")``.
    Phases nest; records carry the innermost phase of their thread. ``step`` (int),
    when given, also sets the current step. Entering and leaving count as progress
    for stall detection. Never raises into the caller.
    """
    if _recorder is None:
        return _NO_PHASE
    return _Phase(name, step)


def step(n: int) -> None:
    """Set the current training step (int). Counts as progress. No-op when tracing is off."""
    rec = _recorder
    if rec is not None:
        f = _fast
        if f is not None:
            try:
                f.step_to(n, _mem, STEP_SAMPLE_GAP_NS)
            except Exception as e:
                _report(e)
            return
        try:
            rec.step(n)
        except Exception as e:
            _report(e)
        s = _sampler
        # MEM_STEP, skipped beside a phase boundary's sample (module doc); not before the
        # sampler's thread started: this sample starts it (hooks/mem/memclock.py)
        if s is not None and (_mono() - s.last_sample_ns() >= STEP_SAMPLE_GAP_NS or s.thread is None):
            s.sample(4)
        _bind()


def heartbeat() -> None:
    """Tell the watcher this process is making progress (long compute without collectives)."""
    rec = _recorder
    if rec is not None:
        try:
            rec.heartbeat()
        except Exception as e:
            _report(e)


def enabled() -> bool:
    """True when this process is traced."""
    return _recorder is not None
