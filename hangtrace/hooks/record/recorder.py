"""The in-process recorder: owns this process's ring file and writes records into it.

Hot path: ``issue()`` and ``complete()`` run once per collective. They write one
128-byte slot and two small header fields with ``struct.pack_into`` into the shared
mapping; no syscalls, no locks (slot indices come from ``itertools.count``, atomic
under the GIL). Everything else (string interning misses, events) takes a lock.
With the C extension ``_fastrec`` (unless ``HANGTRACE_PURE_PYTHON``), ``Recorder(...)``
returns a ``_FastRecorder``: the same records, written by ``_fastrec.Ring`` in C (about
0.2 us per issue+complete pair instead of 1.1 us). Every public method swallows its own
errors (reported once to the run log): a recorder failure never reaches the program.
"""

from __future__ import annotations

import itertools
import os
import struct
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

if TYPE_CHECKING:
    from types import ModuleType

from hangtrace.hooks import preload
from hangtrace.hooks.record import ringsize
from hangtrace.hooks.record.entries import Entries
from hangtrace.tracer import config as _config
from hangtrace.tracer.ring import layout as F

_fastrec_error: Optional[BaseException] = None
_fastrec: Optional[ModuleType]  # the C extension, or None when it is not built
try:  # optional C hot path (built by setup.py where a compiler exists); see _FastRecorder
    from hangtrace.hooks import _fastrec
except ImportError as _e:
    _fastrec = None
    _fastrec_error = _e

_get_ident = threading.get_ident
_mono = time.monotonic_ns
_wall = time.time_ns
# Hot-path constants, bound once (saves module attribute lookups per collective).
_SLOT_PACK = F.SLOT.pack_into
_LIVE_ISSUE_PACK = F.LIVE_ISSUE.pack_into
_COMPLETE_PACK = F.COMPLETE.pack_into
_LIVE_DONE_PACK = F.LIVE_DONE.pack_into
_SLOTS_OFF = F.HEADER_SIZE
_SLOT_SIZE = F.SLOT_SIZE
_COMPLETE_BASE = F.HEADER_SIZE + F.COMPLETE_OFF
_LIVE_ISSUE_OFF = F.LIVE_ISSUE_OFF
_LIVE_DONE_OFF = F.LIVE_DONE_OFF
_S_ISSUED = F.S_ISSUED
_S_COMPLETED = F.S_COMPLETED
_EMPTY_SLOT = bytes(F.SLOT_SIZE)


class Recorder(Entries):
    """One per traced process. ``path`` is the ring file; ``run_dir`` the run directory.

    ``Recorder(...)`` gives a ``_FastRecorder`` (C hot path, same records) when the
    extension is built and ``HANGTRACE_PURE_PYTHON`` is not set (``fast_available()``).
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> "Recorder":
        if cls is Recorder:
            cls = choose()[0]
        return object.__new__(cls)

    def __init__(
        self,
        run_dir: str,
        run_id: str,
        nslots: int,
        log: Callable[..., None],
        full_slots: int = 0,
        lazy: bool = False,
    ) -> None:
        """``nslots``: slots of the ring created now; ``full_slots`` > ``nslots``: this is a
        small ring (a helper's), replaced by one of ``full_slots`` slots by ``grow()``;
        ``lazy`` (a small ring only): kept in memory until ``materialize()`` writes it to
        its file (hooks/record/ringsize.py). Raises OSError when the ring cannot be created."""
        self.run_dir = run_dir
        self.run_id = run_id
        self.log = log  # callable(msg, key) that logs once per key
        self.host = os.uname().nodename  # = socket.gethostname() on Linux
        self.pid = os.getpid()
        self.nslots = nslots
        self.full_slots = full_slots if full_slots > nslots else 0
        self.on_grow: List[Callable[["Recorder"], None]] = []  # called after grow() replaced the ring
        self.library_actor = False  # an actor of Ray's own library (set_meta): keeps a small ring
        self._old_maps: List[Any] = []  # mappings of replaced rings (a writer may still hold one)
        if self.full_slots:
            strtab = (ringsize.SMALL_STRTAB_SIZE, ringsize.SMALL_STRTAB_RESERVE)
        else:
            strtab = (F.DEFAULT_STRTAB_SIZE, F.STRTAB_CHUNK)
        self.path = "%s/ring-%s-%d.htr" % (run_dir, self.host, self.pid)  # (POSIX: no os.path.join)
        self.lazy = lazy and bool(self.full_slots)
        self.fd, self.mm, self.strtab_off, self.path = ringsize.open_ring(
            self.path, self.pid, nslots, strtab, self.lazy
        )
        self.strtab_size, self.strtab_reserved = (
            strtab[0],
            strtab[0 if self.lazy else 1],
        )  # (memory: all of it)
        self.strtab_used = 8
        self._lock = threading.Lock()
        self._counter = itertools.count(1)
        self._strings: Dict[str, int] = {}
        self._threads: Dict[int, Any] = {}
        self._phase: Dict[int, List[Tuple[int, str]]] = {}  # thread ident -> list of (phase strid, name)
        # (_FastRecorder: the fields from here on live in its C Ring, created on first use
        # from mm, nslots, _threads and _phase: keep those above this line, and never
        # rebind _threads or _phase, the Ring holds these very dicts)
        self._cur_phase = 0
        self._step = -1
        self._progress = 0
        self._last = 0
        self.closed = False
        mm = self.mm
        # create_ring wrote the identity (host, proc_start_ticks read once from /proc, env
        # rank, state, phase: layout._write_identity); the run id is the one given here
        F.IDENT.pack_into(
            mm, F.IDENT_OFF, self.pid, os.getppid(), _wall(), _mono(), F.IDENT.unpack_from(mm, F.IDENT_OFF)[4]
        )
        mm[F.RUNID_OFF : F.RUNID_OFF + F.RUNID_LEN] = run_id.encode()[: F.RUNID_LEN - 1].ljust(
            F.RUNID_LEN, b"\0"
        )
        self._touch_progress()

    # --- records ----------------------------------------------------------------
    def _current_phase(self) -> int:
        st = self._phase.get(_get_ident())
        return st[-1][0] if st else self._cur_phase

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
        idx = self._last = next(self._counter)
        now = _mono()
        off = F.HEADER_SIZE + ((idx - 1) % self.nslots) * F.SLOT_SIZE
        try:
            F.SLOT.pack_into(
                self.mm,
                off,
                idx,
                kind,
                flags,
                dtype,
                op,
                group,
                seq,
                numel,
                shape,
                peer,
                self.thread_id(),
                self._current_phase(),
                self._step,
                now,
                _wall(),
                state,
                err,
                now if state != F.S_ISSUED else 0,
                *a,
            )
        except struct.error:
            self.mm[off : off + _SLOT_SIZE] = _EMPTY_SLOT  # no half-written record (see issue)
            raise
        return idx

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
        """Record a collective or p2p op as issued; returns its record index. Hot path."""
        idx = self._last = next(self._counter)
        ident = _get_ident()
        tid = self._threads.get(ident) or self.thread_id()
        st = self._phase.get(ident)
        mm = self.mm
        off = _SLOTS_OFF + (idx - 1) % self.nslots * _SLOT_SIZE
        try:
            _SLOT_PACK(
                mm,
                off,
                idx,
                kind,
                flags,
                dtype,
                op,
                group,
                seq,
                numel,
                shape,
                peer,
                tid,
                st[-1][0] if st else self._cur_phase,
                self._step,
                _mono(),
                _wall(),
                _S_ISSUED,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
            )
        except struct.error:
            # a field out of range (e.g. a root rank beyond int32): pack_into has written
            # the fields before it; empty the slot rather than leave half a record (the
            # index stays used up, as in the C path)
            mm[off : off + _SLOT_SIZE] = _EMPTY_SLOT
            raise
        _LIVE_ISSUE_PACK(mm, _LIVE_ISSUE_OFF, idx, idx)
        return idx

    def complete(self, idx: int, err: Optional[str] = None) -> None:
        """Mark record ``idx`` completed (or failed with ``err`` text) and count progress. Hot path.

        A record already overwritten by the ring (more than ``nslots`` newer records) is
        left alone; progress is still counted.
        """
        now = _mono()
        if err is None:
            nslots = self.nslots
            if self._last - idx < nslots:
                _COMPLETE_PACK(
                    self.mm, _COMPLETE_BASE + (idx - 1) % nslots * _SLOT_SIZE, _S_COMPLETED, 0, now
                )
            self._progress = progress = self._progress + 1
            _LIVE_DONE_PACK(self.mm, _LIVE_DONE_OFF, 0, now, _wall(), progress)
        else:
            if self._last - idx < self.nslots:
                F.COMPLETE.pack_into(
                    self.mm,
                    F.HEADER_SIZE + ((idx - 1) % self.nslots) * F.SLOT_SIZE + F.COMPLETE_OFF,
                    F.S_FAILED,
                    self.intern(err[:4000]),
                    now,
                )
            F.U64.pack_into(self.mm, F.LIVE_DONE_OFF, 0)  # clear in-flight

    def _touch_progress(self) -> None:
        now = _mono()
        self._progress += 1
        F.LIVE_DONE.pack_into(self.mm, F.LIVE_DONE_OFF, 0, now, _wall(), self._progress)

    def memory(
        self, source: int, what: int, a0: int = -1, a1: int = -1, a2: int = -1, a3: int = -1, a4: int = -1
    ) -> int:
        """Write one memory record (kind K_MEM; layout in ``tracer/ring/layout.py``, issue 5).

        ``source``: MEM_TIMER/ENTER/EXIT/STEP/OOM; ``what``: string id of 'host', 'cuda:N'
        or 'gauge:<name>'; ``a0..a4``: byte figures (-1 unknown). Not progress: the
        watcher's stall clock ignores it. Returns the record index.
        """
        return self._slot(F.K_MEM, source, what, 0, 0, 0, 0, -1, F.S_COMPLETED, a=(a0, a1, a2, a3, a4))

    # --- lifecycle ----------------------------------------------------------------
    def mark_exit(self, code: int) -> None:
        """The header's EXIT field: ``code`` as Python saw it; with the C extension the
        status really given to ``exit()`` replaces it (``raise SystemExit(3)`` bypasses
        ``sys.exit``: ``_fastrec.exit_status_target``)."""
        F.EXIT.pack_into(self.mm, F.EXIT_OFF, F.ST_EXITED, int(code), _wall())
        if _fastrec is not None and not getattr(self, "lazy", False) and self.fd >= 0:
            try:
                _fastrec.exit_status_target(self.fd, F.EXIT_OFF)
            except Exception:
                pass

    def close(self) -> None:
        """No more records (the file and the mapping stay). Idempotent. No ``msync``: the
        mapping is ``MAP_SHARED``, records are in the page cache and readable at once (a
        killed process's too); a write-back at exit cost 0.2 ms CPU and 0.5 ms wall per
        exiting helper here (benchmarks/README.md), for durability against a host crash."""
        self.closed = True

    def abandon(self) -> None:
        """Forget the mapping without touching it (used in a forked child: the parent owns it)."""
        self.closed = True
        try:
            os.close(self.fd)
        except OSError:
            pass


def choose(environ: Optional[dict] = None) -> Tuple[type, str]:
    """THE place where the Python or C recorder is chosen: ``(class, reason)``.

    ``reason`` is the run-log line: "recorder: C (_fastrec)", "recorder: Python
    (HANGTRACE_PURE_PYTHON=1)" or "recorder: Python (_fastrec not built: ImportError ...)".
    """
    if _fastrec is None:
        return Recorder, "recorder: Python (_fastrec not built: %s: %s)" % (
            type(_fastrec_error).__name__,
            _fastrec_error,
        )
    if _config.pure_python(environ):
        env = os.environ if environ is None else environ
        return Recorder, "recorder: Python (%s=%s)" % (_config.PURE_PYTHON, env.get(_config.PURE_PYTHON))
    return _FastRecorder, "recorder: C (_fastrec)"


def fast_available(environ: Optional[dict] = None) -> bool:
    """True when new Recorders use the C hot path: ``_fastrec`` is built and
    ``HANGTRACE_PURE_PYTHON`` is not set."""
    return choose(environ)[0] is not Recorder


if _fastrec is not None:
    preload.load("fastrec")  # (hooks/preload.py)
    from hangtrace.hooks.record.fastrecorder import FastRing

    class _FastRecorder(FastRing, Recorder):
        """A Recorder whose hot path is the C ``_fastrec.Ring`` (``fastrecorder.FastRing``);
        records are byte-for-byte those of the Python methods (times aside), see
        tests/unit/test_fastrec.py."""
