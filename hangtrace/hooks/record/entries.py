"""The recorder's records that are not per collective: the header's identity fields (rank,
dump signal), the string table (``intern``, thread names) and the durable entries in it
(metadata, lifecycle events, group definitions), and the phase/step API's records.

A mixin of ``recorder.Recorder`` (and so of its C subclass, whose ``fastrecorder.FastRing``
overrides the phase/step methods with one C call each). In: the calls of the instrumentors
and of ``tracer/api.py``; out: header fields, string-table entries and slots of the ring
(layout in ``tracer/ring/layout.py``).
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from hangtrace.hooks.record import ringsize
from hangtrace.tracer.ring import layout as F

# the C encoder json.dumps builds on every call (None: a Python without _json), see _dumps
_c_make_encoder: Optional[Callable[..., Any]] = getattr(json.encoder, "c_make_encoder", None)
_c_encode_str: Callable[[str], str] = json.encoder.encode_basestring_ascii


def _dumps(obj: Any) -> str:
    """``json.dumps(obj, default=str)``, same text, without the Python layers of
    ``JSONEncoder.encode``/``iterencode`` (about 30 interpreted lines per call: issue 13,
    events and metadata are written in every forked child's after-fork handler)."""
    if _c_make_encoder is None:
        return json.dumps(obj, default=str)
    return "".join(_c_make_encoder({}, str, _c_encode_str, None, ": ", ", ", False, False, True)(obj, 0))


_get_ident = threading.get_ident
_mono = time.monotonic_ns
_wall = time.time_ns


class Entries(ringsize.Growable):
    """Mixin of ``recorder.Recorder``: header fields, string table, durable entries, phases
    and steps. Uses the recorder's ``mm``, ``fd``, ``_lock``, ``strtab_*``, ``_strings``,
    ``_threads``, ``_phase``, ``_cur_phase``, ``_step`` and its slot writer ``_slot``."""

    _strings: Dict[str, int]
    _threads: Dict[int, Any]
    _phase: Dict[int, List[Tuple[int, str]]]  # thread ident -> list of (phase strid, name)
    _cur_phase: int
    _slot: Callable[..., int]

    # --- identity ---------------------------------------------------------------
    def set_rank(self, rank: int, local_rank: int, world_size: int, joined: bool = True) -> None:
        """The rank of this process in the default group it joined (``get_rank()``), not a
        hint; ``joined=False``: the rank it asks for at ``init_process_group`` (its rendezvous)."""
        F.RANK.pack_into(
            self.mm, F.RANK_OFF, rank, local_rank, world_size, F.RANK.unpack_from(self.mm, F.RANK_OFF)[3]
        )
        F.RANK_SOURCE.pack_into(self.mm, F.RANK_SOURCE_OFF, F.RANK_FROM_GROUP if joined else F.RANK_FROM_JOIN)

    def set_dump_signal(self, signum: int) -> None:
        r = F.RANK.unpack_from(self.mm, F.RANK_OFF)
        F.RANK.pack_into(self.mm, F.RANK_OFF, r[0], r[1], r[2], signum)

    def set_meta(self, **meta: Any) -> None:
        """Merge identity fields (Ray actor class/name/id, ...) into the ring's metadata.
        A Ray actor of the user's own class makes this process an actor: a small ring is
        grown first (``ringsize.grows_as_actor``); one of Ray's own library's is marked
        ``library_actor`` (its actor creations and waits keep its small ring)."""
        if meta.get("ray_actor_module"):
            self.library_actor = ringsize.ray_library_actor(meta.get("ray_actor_module"))
        if self.full_slots and ringsize.grows_as_actor(meta):
            self.grow("Ray actor")
        self._append(F.T_META, _dumps(meta))

    # --- string table -----------------------------------------------------------
    def _append(self, tag: int, text: str, limit: int = 65536) -> int:
        """Append an entry to the string table; return its id (0 when full or failed).

        Never raises OSError: when the disk cannot give the table more room (ENOSPC),
        the entry is dropped (logged once) and 0 returned, so events, group definitions
        and the exit record still reach the header and slots.
        """
        data = text.encode("utf-8", "replace")[:limit]
        n = F.STR_ENTRY.size + len(data)
        with self._lock:
            off = self.strtab_used
            if off + n > self.strtab_size and self.full_slots:
                grown = self._grow_locked("string table full")
            else:
                grown = False
            if off + n > self.strtab_size:
                self.log(
                    "string table of %s is full; later strings are recorded as '?'" % self.path, "strtab-full"
                )
                return 0
            if off + n > self.strtab_reserved:
                grow = max(F.STRTAB_CHUNK, n)
                try:
                    F.reserve(self.fd, self.strtab_off + self.strtab_reserved, grow)
                except OSError as e:  # disk full: writing into the hole would SIGBUS
                    self.log(
                        "cannot grow the string table of %s: %s; new strings are dropped" % (self.path, e),
                        "strtab-err",
                    )
                    return 0
                self.strtab_reserved += grow
            base = self.strtab_off + off
            F.STR_ENTRY.pack_into(self.mm, base, tag, len(data))
            self.mm[base + F.STR_ENTRY.size : base + n] = data
            self.strtab_used = off + n
            F.STRUSED.pack_into(self.mm, F.STRUSED_OFF, self.strtab_used)
        if grown:
            self._run_on_grow()
        return off

    def intern(self, text: str) -> int:
        sid = self._strings.get(text)
        if sid is None:
            try:
                sid = self._append(F.T_STR, text, 4096)
            except Exception as e:  # disk full while growing, ...
                self.log("cannot store a string: %r" % e, "strtab-err")
                sid = 0
            self._strings[text] = sid
        return sid

    def thread_id(self) -> int:
        ident = _get_ident()
        sid = self._threads.get(ident)
        if sid is None:
            sid = self._threads[ident] = self.intern(threading.current_thread().name)
        return sid

    def event(self, kind: str, **fields: Any) -> int:
        """Durable lifecycle event (never overwritten by the ring): start, exit, exception, ..."""
        if self.lazy and (kind not in ("start", "exit") or fields.get("code")):
            self.materialize(kind)  # (a helper's start and clean exit alone keep it in memory)
        fields["event"] = kind
        fields.setdefault("wall_ns", _wall())
        fields.setdefault("mono_ns", _mono())
        fields.setdefault("thread", threading.current_thread().name)
        sid = self._append(F.T_EVENT, _dumps(fields))
        self._slot(F.K_EVENT, 0, self.intern(kind), 0, 0, 0, 0, -1, F.S_COMPLETED, a=(sid, 0, 0, 0, 0))
        return sid

    def group_created(self, info: dict) -> None:
        """Durable group definition: name, desc, backend, ranks (global), order.
        Joining a group makes this process a rank: a small ring is grown first."""
        if self.full_slots and info.get("member") is not False:
            self.grow("joined process group %s" % (info.get("name"),))
        self._append(F.T_GROUP, _dumps(info))
        self._slot(
            F.K_GROUP,
            F.OP_IDS.get(info.get("op", "new_group"), 0),
            self.intern(str(info.get("name"))),
            0,
            0,
            0,
            0,
            -1,
            F.S_COMPLETED,
        )

    # --- phases, steps, heartbeats -----------------------------------------------------
    def phase_enter(self, name: str, step: Optional[int] = None, grow: bool = True) -> None:
        """Enter phase ``name``. ``grow=False``: keep a small ring small (a method call of an
        actor of Ray's own library, ``ringsize.grows_as_actor``)."""
        if self.full_slots and grow:
            self.grow("phase API")
        if step is not None:
            self._step = int(step)
        sid = self.intern(str(name))
        st = self._phase.setdefault(_get_ident(), [])
        st.append((sid, name))
        self._cur_phase = sid
        F.PHASE.pack_into(self.mm, F.PHASE_OFF, sid, len(st), self._step)
        self._slot(F.K_PHASE_ENTER, 0, 0, 0, 0, 0, 0, -1, F.S_COMPLETED)
        self._touch_progress()

    def phase_exit(self, name: str, error: Optional[str] = None) -> None:
        st = self._phase.get(_get_ident())
        self._slot(
            F.K_PHASE_EXIT,
            0,
            0,
            0,
            0,
            0,
            0,
            -1,
            F.S_FAILED if error else F.S_COMPLETED,
            err=self.intern(error[:2000]) if error else 0,
        )
        if st:
            # pop up to and including the innermost entry of this name
            for i in range(len(st) - 1, -1, -1):
                if st[i][1] == name:
                    del st[i:]
                    break
        self._cur_phase = st[-1][0] if st else 0
        F.PHASE.pack_into(self.mm, F.PHASE_OFF, self._cur_phase, len(st) if st else 0, self._step)
        self._touch_progress()

    def step(self, n: int, grow: bool = True) -> None:
        """Set the current step (a K_STEP record; progress). ``grow=False``: keep a small
        ring small (a forked child inheriting its parent's step)."""
        if self.full_slots and grow:
            self.grow("step API")
        self._step = int(n)
        F.PHASE.pack_into(
            self.mm, F.PHASE_OFF, self._cur_phase, F.PHASE.unpack_from(self.mm, F.PHASE_OFF)[1], self._step
        )
        self._slot(F.K_STEP, 0, 0, self._step, 0, 0, 0, -1, F.S_COMPLETED)
        self._touch_progress()

    def heartbeat(self) -> None:
        self._touch_progress()

    def current(self) -> Tuple[Optional[str], Optional[int]]:
        """(phase name or None, step or None) of the calling thread."""
        st = self._phase.get(_get_ident())
        return (st[-1][1] if st else None), (self._step if self._step >= 0 else None)
