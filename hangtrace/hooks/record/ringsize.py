"""Rings sized by role (issue 13): a small ring for helpers, the full ring for ranks and actors.

A traced process starts with a small ring (``HANGTRACE_HELPER_SLOTS`` slots, default 256
= 32 KiB, and a 256 KiB string table of which 16 KiB are reserved on disk: about 52 KiB
on disk). DataLoader workers, multiprocessing's resource tracker, compile workers and
other helpers never leave it: their start, exit, exceptions and signal stacks are in it
(events live in the string table, which the slot ring never overwrites), readable after
SIGKILL like any ring.

The recorder replaces it by the full ring (``HANGTRACE_SLOTS``, default 16384 slots = 2
MiB, 4 MiB string table) the moment the process shows it is more than a helper: it joins
a process group (``Recorder.group_created`` of a group it is a member of, also for
groups that existed before tracing began), becomes a Ray actor (``set_meta`` with a Ray
actor id), uses the phase/step API, or fills the small string table. ``grow_file``
builds the full ring under a hidden name (readers glob ``ring-*.htr``, never dot files)
with the same header, every record at its slot for the new size and the string table
byte for byte (string ids are offsets into the table, so they stay valid), then renames
it over the small one: a reader sees either the small or the full ring, never half of
one. Same format (version 1), only ``nslots``/``strtab_off``/``strtab_size`` differ; the
reader takes them from the header (docs/FORMAT.md).

A forked child's small ring is *lazy* (issue 13): built in anonymous memory at the fork
(``layout.anon_ring``, no file) and written to its file by ``Growable.materialize`` when
the child records something that matters (an event other than its start or a clean exit;
the memory sampler's first tick, ``memfork.on_tick``) or grown straight to the full ring
(a group, an actor id, the phase/step API). A DataLoader worker of a short epoch that
exits cleanly so costs no file at all; one that lives on costs its ring once per
sampling interval at most. The child does not even build that recorder: its parent built
one before its first fork and keeps it unused (``bootstrap.Runtime.prepare_child``), and
each child ``adopt``s its own copy-on-write copy of it (a new Recorder is about a hundred
interpreted lines, each first touch of a page of the parent's heap a copy-on-write fault).

Standard library only: imported in every traced process.
"""

from __future__ import annotations

import mmap
import os
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from hangtrace.tracer.ring.layout import proc_start_ticks
from hangtrace.tracer.ring import layout as F

_wall, _mono = time.time_ns, time.monotonic_ns
#: ``os.environ``'s own bytes dict (CPython's ``os._Environ._data``, updated by every
#: assignment): read in a forked child without ``os.environ``'s Python frames
_environb: Optional[dict] = getattr(os.environ, "_data", None)


def _env_int(name: bytes) -> int:
    """The environment variable ``name`` as an int, -1 when unset or not an int."""
    try:
        return int(_environb[name]) if _environb is not None else F._env_int(name.decode())
    except (KeyError, ValueError):
        return -1


#: String table of a small ring (bytes, apparent size; sparse) and the part reserved on
#: disk at creation (bytes). A helper's events (start with argv, exit, an exception with
#: up to 16 KB of traceback) fit; more grows the ring.
SMALL_STRTAB_SIZE = 256 << 10
SMALL_STRTAB_RESERVE = 16 << 10


def ray_library_actor(module: Any) -> bool:
    """Is an actor class of module ``module`` one of Ray's own library's (``ray``,
    ``ray.train...``, ``ray.data...``, ``ray.serve...``): Ray Train's controller,
    SynchronizationActor, PreemptionWatcher, DatasetManager and placement-group cleaner?"""
    m = str(module or "")
    return m == "ray" or m.startswith("ray.")


def grows_as_actor(meta: Dict[str, Any]) -> bool:
    """Does identity ``meta`` (``Recorder.set_meta``) make this process an actor that needs
    the full ring? An actor of the user's own class (``ray_actor_module`` known and not
    Ray's library's) does. Ray's own library actors keep a helper's ring (issue 40: seven of
    them in a Ray Train run held 15 MiB of 39) unless they join a process group
    (``RayTrainWorker``) or use the phase/step API themselves; their events (start, exit,
    exceptions, signal stacks) live in the string table like a helper's. The worker-level
    identity (actor id, no class yet) waits for the class, recorded at the actor's first
    method call."""
    return (
        bool(meta.get("ray_actor_id"))
        and bool(meta.get("ray_actor_module"))
        and not ray_library_actor(meta.get("ray_actor_module"))
    )


def grow_file(
    path: str, old: Any, old_nslots: int, old_strtab_off: int, strtab_used: int, nslots: int
) -> Tuple[int, mmap.mmap, int, int]:
    """Write a ring of ``nslots`` slots holding what mapping ``old`` holds and put it at ``path``.

    ``old``: the mapping of the current ring (``old_nslots`` slots, string table at
    ``old_strtab_off`` with ``strtab_used`` bytes in use). Returns ``(fd, mmap,
    strtab_off, strtab_reserved)`` of the new ring (bytes). Raises OSError (ENOSPC, ...)
    and then leaves the old ring in place and no temporary file behind. Records written
    into ``old`` by another thread while this runs may be missing from the copy.
    """
    strtab_off, total = F.layout(nslots, F.DEFAULT_STRTAB_SIZE)
    d, name = os.path.split(path)
    tmp = os.path.join(d, ".%s.%d.growing" % (name, os.getpid()))
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    mm = None
    try:
        os.ftruncate(fd, total)
        chunk = F.STRTAB_CHUNK
        reserved = max(chunk, (strtab_used + chunk - 1) // chunk * chunk)
        F.reserve(fd, 0, strtab_off + reserved)
        # the pages written below, written with pwrite first: a first store through the
        # mapping into a fallocated (unwritten) ext4 block is slow (layout._write_first_pages)
        os.pwrite(fd, bytes(F.HEADER_SIZE + min(old_nslots, nslots) * F.SLOT_SIZE), 0)
        os.pwrite(fd, bytes(old[old_strtab_off : old_strtab_off + strtab_used]), strtab_off)
        mm = mmap.mmap(fd, total, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        mm[0 : F.HEADER_SIZE] = old[0 : F.HEADER_SIZE]
        F.HDR_FIXED.pack_into(
            mm, 0, F.MAGIC, F.VERSION, F.HEADER_SIZE, F.SLOT_SIZE, nslots, strtab_off, F.DEFAULT_STRTAB_SIZE
        )
        size = F.SLOT_SIZE
        for pos in range(old_nslots):
            o = F.HEADER_SIZE + pos * size
            (idx,) = F.U64.unpack_from(old, o)
            if idx and (idx - 1) % old_nslots == pos:
                n = F.HEADER_SIZE + (idx - 1) % nslots * size
                mm[n : n + size] = old[o : o + size]
        os.rename(tmp, path)
    except BaseException:
        F.discard_partial(fd, mm, tmp)
        raise
    return fd, mm, strtab_off, reserved


def free_ring_path(path: str, pid: int) -> str:
    """Where to put our ring when ``path`` exists already.

    Same pid and same process start time: the file was made by this very process before
    an ``exec`` (``subprocess.Popen(preexec_fn=...)`` runs fork hooks in the child), so it
    is replaced. Otherwise it is an earlier process whose pid was reused: its record is
    kept and ours gets the start time in its name.
    """
    from hangtrace.tracer.ring import reader as R

    ticks = proc_start_ticks(pid)
    try:
        with open(path, "rb") as f:
            h = R.read_header(f.read(F.HEADER_SIZE), path)
        same = h["pid"] == pid and h["proc_start_ticks"] == ticks
    except Exception:
        same = False
    if same:
        os.unlink(path)
        return path
    return "%s-%d.htr" % (path[: -len(".htr")], ticks or 0)  # (never None: default 0)


def open_ring(
    path: str,
    pid: int,
    nslots: int,
    strtab: Tuple[int, int],
    lazy: bool = False,
    content: Optional[bytes] = None,
) -> Tuple[int, Any, int, str]:
    """The ring of a new recorder: ``(fd, mmap, strtab_off, path)``. ``lazy``: in anonymous
    memory (fd -1, no file yet: ``Growable.materialize`` writes it); else the file at
    ``path`` or, when that is taken, at ``free_ring_path``. ``strtab``: (size, bytes
    reserved on disk). ``content``: see ``layout.create_ring``. Raises OSError."""
    if lazy:
        mm, strtab_off = F.anon_ring(nslots, strtab[0])
        return -1, mm, strtab_off, path
    try:
        fd, mm, strtab_off = F.create_ring(path, nslots, strtab[0], strtab[1], content)
    except FileExistsError:
        path = free_ring_path(path, pid)
        fd, mm, strtab_off = F.create_ring(path, nslots, strtab[0], strtab[1], content)
    return fd, mm, strtab_off, path


class Growable:
    """Mixin of ``recorder.Recorder`` (base of ``entries.Entries``): replacing a small ring by the full one in place.

    Uses the recorder's ``path``, ``mm``, ``fd``, ``nslots``, ``strtab_*``, ``full_slots``
    (0 = full-size already), ``_lock``, ``log`` and ``on_grow`` (callables run with the
    recorder after the ring was replaced: the torch wrappers re-read its C Ring)."""

    path: str
    mm: Any
    fd: int
    nslots: int
    full_slots: int
    strtab_off: int
    strtab_size: int
    strtab_used: int
    strtab_reserved: int
    on_grow: List[Callable[[Any], None]]
    _old_maps: List[Any]
    _lock: Any
    log: Callable[..., None]
    pid: int
    lazy: bool = False  # the ring is in anonymous memory, not yet in its file (a forked helper)
    on_lost: Optional[Callable[[BaseException], None]] = None  # a lazy ring could not be written
    run_dir: str
    host: str
    _step: int
    _touch_progress: Callable[[], None]
    event: Callable[..., int]
    #: a lazy ring's start record, kept as its fields until the ring goes to its file
    #: (``start_event``); None once written, or when there is none
    _pending_start: Optional[Dict[str, Any]] = None

    def adopt(self, log: Callable[..., None]) -> None:
        """In a forked child: make this lazy recorder, which the parent built before the
        fork and never used (``bootstrap.Runtime.prepare_child``), this process's: its pid,
        ring path, identity (pid, parent, start time; the rank hint from the environment
        as it is now: a launcher may set RANK between forks) and run log ``log``."""
        pid = self.pid = os.getpid()
        self.log = log
        self.path = "%s/ring-%s-%d.htr" % (self.run_dir, self.host, pid)
        F.IDENT.pack_into(self.mm, F.IDENT_OFF, pid, os.getppid(), _wall(), _mono(), 0)
        F.RANK.pack_into(
            self.mm, F.RANK_OFF, _env_int(b"RANK"), _env_int(b"LOCAL_RANK"), _env_int(b"WORLD_SIZE"), 0
        )
        self._touch_progress()

    def start_event(self, **fields: Any) -> None:
        """The process's start record (``event("start", **fields)``). A lazy ring (a forked
        helper's, issue 13) keeps it as its fields, with the time of this call, and writes it
        first when the ring goes to its file (``materialize``): a helper that exits cleanly
        before then never encodes it (about 0.17 ms of a fresh child's CPU, most of it
        copy-on-write faults of the first run of the encoding code; benchmarks/README.md)."""
        if not self.lazy:
            self.event("start", **fields)
            return
        fields["wall_ns"], fields["mono_ns"] = _wall(), _mono()
        self._pending_start = fields

    def _write_pending_start(self) -> None:
        fields, self._pending_start = self._pending_start, None
        if fields is not None:
            import threading  # (loaded: the recorder's module imports it)

            # the thread that forked is the child's main thread (threading._after_fork)
            fields.setdefault("thread", threading.main_thread().name)
            self.event("start", **fields)

    def inherit_step(self, step: int) -> None:
        """In the parent, on the recorder prepared for its next child: the current step
        (-1: none) the child starts in, set without a record (every record carries it)."""
        if self._step != step:
            self._step = step
            F.PHASE.pack_into(self.mm, F.PHASE_OFF, 0, 0, step)

    def materialize(self, reason: str) -> bool:
        """Write a lazy ring (a forked helper's, kept in memory since the fork) to its file,
        same size, every record so far; from now on the recorder writes to the file. Called
        when the helper records something that matters (an event other than its start or
        a clean exit; the memory sampler's first tick: it has lived ``interval`` seconds).
        Returns True when it did. Never raises: a failure calls ``on_lost`` (tracing off
        in this child) and the ring stays in memory."""
        if not self.lazy:
            return False
        with self._lock:
            ok = self._materialize_locked(reason)
        if ok:
            self._run_on_grow()
        return ok

    def _materialize_locked(self, reason: str) -> bool:
        if not self.lazy:
            return False
        self._fill_ticks()
        self.lazy = False
        used, chunk, size = self.strtab_used, SMALL_STRTAB_RESERVE, self.strtab_size
        reserved = (used + chunk - 1) // chunk * chunk
        try:
            content = bytes(self.mm[0 : self.strtab_off + used])
            fd, mm, strtab_off, self.path = open_ring(
                self.path, self.pid, self.nslots, (size, reserved), content=content
            )
        except Exception as e:
            self._lost(e, reason)
            return False
        self._old_maps.append(self.mm)
        self._remap(fd, mm, self.nslots, strtab_off, reserved)
        self.strtab_size = size
        return True

    def _fill_ticks(self) -> None:
        """A lazy ring's process start time (``layout.anon_ring`` leaves it 0), read now:
        readers tell a reused pid's ring by it (``free_ring_path``)."""
        ident = F.IDENT.unpack_from(self.mm, F.IDENT_OFF)
        if not ident[4]:
            F.IDENT.pack_into(self.mm, F.IDENT_OFF, *ident[:4], proc_start_ticks(self.pid) or 0)

    def _lost(self, e: BaseException, reason: str) -> None:
        """A lazy ring could not be written to its file: log, then ``on_lost``."""
        self.lazy = False
        self.log("cannot write the ring %s (%s): %r" % (self.path, reason, e), "lazy-ring")
        if self.on_lost is not None:
            try:
                self.on_lost(e)
            except Exception:
                pass

    def grow(self, reason: str) -> bool:
        """Replace a small ring by the full one (same path, same records). Returns True
        when it did; False when the ring is full-size already or growing failed (logged
        once; the small ring stays in use). Never raises."""
        if not self.full_slots:
            return False
        with self._lock:
            ok = self._grow_locked(reason)
        if ok:
            self._run_on_grow()
        return ok

    def _run_on_grow(self) -> None:
        """After the ring was replaced: a lazy ring's pending start record first, then
        every ``on_grow`` callable. Never raises."""
        try:
            self._write_pending_start()
        except Exception as e:
            self.log("the start record of a forked helper: %r" % (e,), "lazy-start")
        for fn in list(self.on_grow):
            try:
                fn(self)
            except Exception as e:
                self.log("after growing the ring: %r" % (e,), "grow-cb")

    def _grow_locked(self, reason: str) -> bool:
        nslots = self.full_slots
        if not nslots:
            return False
        self.full_slots = 0  # one attempt per process
        try:
            if self.lazy:
                self._fill_ticks()
                if os.path.lexists(self.path):  # (an earlier process's: grow_file renames over it)
                    self.path = free_ring_path(self.path, self.pid)
            fd, mm, strtab_off, reserved = grow_file(
                self.path, self.mm, self.nslots, self.strtab_off, self.strtab_used, nslots
            )
        except Exception as e:
            self.log(
                "cannot grow the ring %s to %d slots (%s): %r; the small ring stays"
                % (self.path, nslots, reason, e),
                "grow",
            )
            if self.lazy:
                self._lost(e, reason)
            return False
        self.lazy = False
        old_fd = self.fd
        self._old_maps.append(self.mm)
        self._remap(fd, mm, nslots, strtab_off, reserved)
        try:
            os.close(old_fd)
        except OSError:
            pass
        self.log("ring grown to %d slots: %s" % (nslots, reason), "grown")
        return True

    def _remap(self, fd: int, mm: Any, nslots: int, strtab_off: int, reserved: int) -> None:
        self.fd, self.mm, self.nslots = fd, mm, nslots
        self.strtab_off, self.strtab_size, self.strtab_reserved = strtab_off, F.DEFAULT_STRTAB_SIZE, reserved
