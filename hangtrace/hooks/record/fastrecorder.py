"""The C hot path of the recorder (``_fastrec.Ring``): ``FastRing``, the methods that
``recorder._FastRecorder`` (``FastRing`` + ``Recorder``, chosen by ``recorder.choose()``)
takes from the C Ring instead of Recorder's Python. In: the recorder's mapping, dicts and
counters; out: the same records, written in C.

Imported by ``recorder`` only when the C extension is built; it imports nothing of the
recorder at run time (its base is ``Recorder`` for the type checker only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Tuple

from hangtrace.hooks import _fastrec
from hangtrace.tracer import api
from hangtrace.tracer.ring import layout as F

if TYPE_CHECKING:
    from hangtrace.hooks.record.recorder import Recorder as _Base
else:
    _Base = object


def _ring_field(name: str, doc: str) -> property:
    def get(self: Any) -> Any:
        return getattr(self._ring(), name)

    def set(self: Any, value: Any) -> None:
        setattr(self._ring(), name, value)

    return property(get, set, doc=doc)


class FastRing(_Base):
    """Mixin of ``recorder._FastRecorder`` (before ``Recorder``): its hot path is the C
    ``_fastrec.Ring``; records are byte-for-byte those of the Python methods (times aside),
    see tests/unit/test_fastrec.py.

    The record counter and ``_last``, ``_progress``, ``_step``, ``_cur_phase`` live in the
    Ring (properties below) so that the Python methods (phases, steps, events, memory)
    and the C writer share them. ``issue`` and ``complete`` become the Ring's own
    methods as instance attributes: no Python frame per collective. The Ring keeps a
    buffer export of ``mm`` for its lifetime (the mapping is never closed anyway).
    """

    _last = _ring_field("last", "index of the newest record")
    _progress = _ring_field("progress", "progress events so far")
    _step = _ring_field("step", "current step, -1 = none")
    _cur_phase = _ring_field("cur_phase", "string id of the current phase, 0 = none")

    def _remap(self, fd: int, mm: Any, nslots: int, strtab_off: int, reserved: int) -> None:
        """After ``grow``: a new C Ring over the new mapping, carrying the counters over
        (the old Ring keeps its buffer export of the old mapping, so a writer that still
        holds it writes there harmlessly)."""
        old = self.__dict__.get("_fast")
        super()._remap(fd, mm, nslots, strtab_off, reserved)
        r = _fastrec.Ring(mm, nslots, self._threads, self._phase, self.thread_id, self.intern)
        r.strings = self._strings
        if old is not None:
            r.counter, r.last, r.progress = old.counter, old.last, old.progress
            r.step, r.cur_phase, r.mem_last_ns = old.step, old.cur_phase, old.mem_last_ns
        api._unbind()  # (the API's one-call path held the old Ring)
        self._fast = r
        self.issue = r.issue  # type: ignore[method-assign]  # the Ring's own method: no Python frame per call
        self.complete = r.complete  # type: ignore[method-assign]  # (same)

    def _ring(self) -> Any:
        r = self.__dict__.get("_fast")
        if r is None:
            r = _fastrec.Ring(self.mm, self.nslots, self._threads, self._phase, self.thread_id, self.intern)
            r.strings = self._strings
            self._fast = r
            self.issue = r.issue  # type: ignore[method-assign]  # the Ring's own method: no Python frame per call
            self.complete = r.complete  # type: ignore[method-assign]  # (same)
        return r

    def issue(
        self,
        kind: int,
        op: int,
        group: int,
        seq: int,
        numel: int,
        shape: int,
        dtype: int,
        peer: int,
        flags: int,
    ) -> int:
        return self._ring().issue(kind, op, group, seq, numel, shape, dtype, peer, flags)

    def complete(self, idx: int, err: Optional[str] = None) -> None:
        return self._ring().complete(idx, err)

    def _slot(
        self,
        kind: int,
        op: int,
        group: int,
        seq: int,
        numel: int,
        shape: int,
        dtype: int,
        peer: int,
        state: int,
        flags: int = 0,
        a: Tuple[int, ...] = (0, 0, 0, 0, 0),
        err: int = 0,
    ) -> int:
        return self._ring().slot(kind, op, group, seq, numel, shape, dtype, peer, state, flags, err, *a)

    def _touch_progress(self) -> None:
        self._ring().touch()

    # --- the phase/step API and memory samples: once per phase or step, not per collective;
    # the same records as Recorder's methods, each written by one C call of the Ring
    # (``phase_in``, ``phase_out``, ``step_to``; Recorder's methods go through the
    # properties above: about ten Python frames per call, which in a training step, between
    # kernels that evict the caches, come back cold; benchmarks/README.md, issue 13).
    # ``tracer/api.py`` calls the Ring's methods itself, with the memory sample, once the
    # ring is full-size (``api._bind``).
    def phase_enter(self, name: str, step: Optional[int] = None, grow: bool = True) -> None:
        if self.full_slots and grow:
            self.grow("phase API")
        (self.__dict__.get("_fast") or self._ring()).phase_in(str(name), step, None)

    def phase_exit(self, name: str, error: Optional[str] = None) -> None:
        (self.__dict__.get("_fast") or self._ring()).phase_out(name, None, error)

    def step(self, n: int, grow: bool = True) -> None:
        if self.full_slots and grow:
            self.grow("step API")
        (self.__dict__.get("_fast") or self._ring()).step_to(n, None, 0)

    def memory(
        self, source: int, what: int, a0: int = -1, a1: int = -1, a2: int = -1, a3: int = -1, a4: int = -1
    ) -> int:
        return (self.__dict__.get("_fast") or self._ring()).slot(
            F.K_MEM, source, what, 0, 0, 0, 0, -1, F.S_COMPLETED, 0, 0, a0, a1, a2, a3, a4
        )
