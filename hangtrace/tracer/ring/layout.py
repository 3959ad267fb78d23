"""The ring file: one memory-mapped, fixed-size flight record per traced process.

Layout (version 1, little endian; documented in docs/FORMAT.md)::

    [0, 4096)                    header: identity + liveness fields
    [4096, 4096 + nslots*128)    slots: fixed 128-byte records, slot = (idx-1) % nslots
    [strtab_off, +strtab_size)   string table, append only: entries ``<u8 tag><u32 len><bytes>``

The file lives in a ``MAP_SHARED`` mapping, so every byte the writer stored is in the
page cache and readable after the process is SIGKILLed (the kernel writes it back;
nothing depends on the process exiting cleanly).

``proc_start_ticks`` (from /proc) ties a ring to the process that wrote it (pid reuse).
This module is imported inside traced processes: it imports only the standard library.
"""

import mmap
import os
import struct
from typing import Optional


def proc_start_ticks(pid: int, default: Optional[int] = 0) -> Optional[int]:
    """Start time of ``pid`` in clock ticks since boot (/proc/PID/stat field 22), or
    ``default`` when the process does not exist or cannot be read. Tells a reused pid
    from the process that wrote a ring (proc(5): the value never changes, even at exec)."""
    try:
        # a raw descriptor, not open(): no buffered file object (this runs in every
        # forked child's after-fork handler, issue 13); the line is < 1 KiB (comm <= 16 bytes)
        fd = os.open("/proc/%d/stat" % pid, os.O_RDONLY | os.O_CLOEXEC)
        try:
            data = os.read(fd, 4096)
        finally:
            os.close(fd)
        return int(data.rsplit(b")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return default


MAGIC = b"HTRING01"
VERSION = 1
HEADER_SIZE = 4096
SLOT_SIZE = 128
DEFAULT_STRTAB_SIZE = 4 << 20

# --- header ---------------------------------------------------------------------
HDR_FIXED = struct.Struct(
    "<8sIIIIQQ"
)  # magic, version, header_size, slot_size, nslots, strtab_off, strtab_size
IDENT_OFF = 48
IDENT = struct.Struct("<qqqqQ")  # pid, ppid, start_wall_ns, start_mono_ns, proc_start_ticks
HOST_OFF, HOST_LEN = 96, 64
RUNID_OFF, RUNID_LEN = 160, 64
LIVE_ISSUE_OFF = 512
LIVE_ISSUE = struct.Struct("<QQ")  # next_idx, inflight_idx (record idx, 0 = none)
LIVE_DONE_OFF = 520
LIVE_DONE = struct.Struct("<QQQQ")  # inflight_idx, progress_mono_ns, progress_wall_ns, progress_count
PHASE_OFF = 552
PHASE = struct.Struct("<Iiq")  # cur_phase strid, phase depth, cur_step
STRUSED_OFF = 568
U64 = struct.Struct("<Q")
STRUSED = U64
EXIT_OFF = 576
EXIT = struct.Struct("<iiQ")  # state, exit_code, exit_wall_ns
RANK_OFF = 592
RANK = struct.Struct("<iiii")  # rank, local_rank, world_size, dump signal registered (0 = none)
RANK_SOURCE_OFF = 608
RANK_SOURCE = struct.Struct("<i")  # where the rank field came from (RANK_FROM_*)
#: rank_source values. A ring written before this field existed reads 0 (the env hint):
#: the environment's RANK is only a hint (DataLoader workers, resource trackers and any
#: child of a rank inherit it); a process is a rank once it joined a process group.
#: RANK_FROM_JOIN: it called ``init_process_group`` asking to be this rank (the call's
#: ``rank``, else RANK at the call) and has not joined yet: the rendezvous is running.
RANK_FROM_ENV, RANK_FROM_GROUP, RANK_FROM_JOIN = 0, 1, 2

# process states stored in the header
ST_RUNNING, ST_EXITED = 1, 2

# --- slots ----------------------------------------------------------------------
SLOT = struct.Struct("<QBBBBIqqIiIIqQQB3xIQqqqqq")
assert SLOT.size == SLOT_SIZE
COMPLETE_OFF = 72
COMPLETE = struct.Struct("<B3xIQ")  # state, err strid, t_end_mono_ns

# record kinds
K_COLL, K_P2P, K_GROUP, K_PHASE_ENTER, K_PHASE_EXIT, K_STEP, K_HEARTBEAT, K_EVENT, K_MEM, K_WAIT = range(
    1, 11
)
KIND_NAMES = {
    K_COLL: "collective",
    K_P2P: "p2p",
    K_GROUP: "group",
    K_PHASE_ENTER: "phase_enter",
    K_PHASE_EXIT: "phase_exit",
    K_STEP: "step",
    K_HEARTBEAT: "heartbeat",
    K_EVENT: "event",
    K_MEM: "memory",
    K_WAIT: "ray_wait",
}
# Ray waits (kind K_WAIT, issue 9; writer hooks/rayhooks/ray_calls.py): a ray.get / ray.wait on the
# result of Ray actor method calls. group = string id of a JSON text {"api": "get"|"wait",
# "n": refs, "targets": [{"actor_id", "class", "method"}], "more": targets left out}; seq =
# number of refs; state issued while waiting, completed / failed (err: the exception
# type) when the call returned. Not progress.
# Memory records (kind K_MEM, issue 5; writer: hooks/mem/sampler.py via Recorder.memory,
# reader: tracer/analyze/memory/). The generic slot fields are reused, no layout change:
#   op     = sample source: MEM_TIMER 1, MEM_ENTER 2 (just after a phase was entered),
#            MEM_EXIT 3 (just before it is left), MEM_STEP 4 (tracer.step), MEM_OOM 5 (an
#            out-of-memory error: CUDA allocator observer, or an OOM exception leaving a
#            phase / reaching sys.excepthook)
#   group  = string id of what was sampled: 'host', 'cuda:N', 'gauge:<name>'
#   phase, step, thread, t_*: as for every record
#   a0..a4 = host:   rss bytes, swap bytes, cgroup usage bytes, cgroup limit bytes
#                    (0 = no limit), cgroup oom_kill count
#            cuda:N: allocated, reserved, peak allocated, device free, device total (bytes)
#                    (MEM_OOM from the allocator: a0 = bytes requested, a1 = the
#                    allocator's device figure, a3 = device free)
#            gauge:  a0 = value bytes, a1 = limit bytes (0 = none)
#   -1 = unknown / unreadable. decode_slots reports ``op`` through OPS (1 -> 'all_reduce'
#   ...); tracer/analyze/memory/ maps it back with OP_IDS.
MEM_TIMER, MEM_ENTER, MEM_EXIT, MEM_STEP, MEM_OOM = 1, 2, 3, 4, 5
MEM_SOURCES = ("", "timer", "phase_enter", "phase_exit", "step", "oom")

# record states
S_ISSUED, S_COMPLETED, S_FAILED = 1, 2, 3
STATE_NAMES = {0: "none", S_ISSUED: "issued", S_COMPLETED: "completed", S_FAILED: "failed"}
# flags
F_ASYNC, F_BATCH, F_CUDA = 1, 2, 4

OPS = (
    "",
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "broadcast",
    "broadcast_object_list",
    "reduce",
    "gather",
    "gather_object",
    "scatter",
    "scatter_object_list",
    "barrier",
    "monitored_barrier",
    "send",
    "recv",
    "isend",
    "irecv",
    "batch_isend_irecv",
    "init_process_group",
    "new_group",
    "new_subgroups",
    "destroy_process_group",
    "_allgather_base",
    "_reduce_scatter_base",
    # appended (ids of older rings keep their meaning)
    "all_gather_single",
    "reduce_scatter_single",
    "all_gather_coalesced",
    "all_reduce_coalesced",
    "send_object_list",
    "recv_object_list",
)
OP_IDS = {name: i for i, name in enumerate(OPS)}

DTYPES = (
    "",
    "float32",
    "float64",
    "float16",
    "bfloat16",
    "uint8",
    "int8",
    "int16",
    "int32",
    "int64",
    "bool",
    "complex64",
    "complex128",
    "float8_e4m3fn",
    "float8_e5m2",
    "uint16",
    "uint32",
    "uint64",
    "object",
)
DTYPE_IDS = {name: i for i, name in enumerate(DTYPES)}

# string table tags
T_STR, T_GROUP, T_EVENT, T_META = 1, 2, 3, 4
STR_ENTRY = struct.Struct("<BI")
STRTAB_CHUNK = 1 << 16  # bytes reserved on disk at a time


def layout(nslots: int, strtab_size: int = DEFAULT_STRTAB_SIZE) -> "tuple[int, int]":
    """Return ``(strtab_off, total_size)`` in bytes for a ring of ``nslots`` slots."""
    strtab_off = HEADER_SIZE + nslots * SLOT_SIZE
    return strtab_off, strtab_off + strtab_size


def reserve(fd: int, off: int, length: int) -> None:
    """Allocate disk blocks for ``[off, off+length)`` of a ring file.

    A write through a mapping into an unallocated block of a full file system kills the
    process with SIGBUS; reserving first turns that into an OSError (ENOSPC) that the
    writer can swallow. Falls back to writing zeros where fallocate is unsupported.
    """
    try:
        os.posix_fallocate(fd, off, length)
        return
    except OSError as e:
        if e.errno not in (95,):  # EOPNOTSUPP
            raise
    os.pwrite(fd, bytes(length), off)


_ZERO_PAGES = bytes(2 * 4096)


def _write_first_pages(fd: int, strtab_off: int, end: int) -> None:
    """Write zeros over the pages every ring writes at once (the header, the first slots,
    the start of the string table), after ``reserve``. On ext4 a first store through the
    mapping into a block that ``posix_fallocate`` left unwritten costs a slow
    ``page_mkwrite`` (measured here: three such pages 135 us, written first with
    ``pwrite`` 53 us per ring); every traced process, every forked DataLoader worker
    among them, creates a ring (issue 13). Writes nothing at or past ``end`` (bytes: the
    end of the reserved part), so the file keeps its size."""
    os.pwrite(fd, _ZERO_PAGES[: max(0, min(len(_ZERO_PAGES), end))], 0)
    if strtab_off < end:
        os.pwrite(fd, _ZERO_PAGES[: min(4096, end - strtab_off)], strtab_off)


def _env_int(name: str, default: int = -1) -> int:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return default


def _write_identity(mm: mmap.mmap, ticks: bool = True) -> None:
    """Identity fields known at creation (the recorder writes the same ones again).
    ``ticks=False``: the process start time (``/proc/PID/stat``) is left 0, for the one
    who writes the ring to its file to fill in (``anon_ring``)."""
    import time

    pid = os.getpid()
    IDENT.pack_into(
        mm,
        IDENT_OFF,
        pid,
        os.getppid(),
        time.time_ns(),
        time.monotonic_ns(),
        proc_start_ticks(pid) if ticks else 0,
    )
    mm[HOST_OFF : HOST_OFF + HOST_LEN] = os.uname().nodename.encode()[: HOST_LEN - 1].ljust(HOST_LEN, b"\0")
    run_id = os.environ.get("HANGTRACE_RUN_ID", "")
    mm[RUNID_OFF : RUNID_OFF + RUNID_LEN] = run_id.encode()[: RUNID_LEN - 1].ljust(RUNID_LEN, b"\0")
    EXIT.pack_into(mm, EXIT_OFF, ST_RUNNING, 0, 0)
    RANK.pack_into(mm, RANK_OFF, _env_int("RANK"), _env_int("LOCAL_RANK"), _env_int("WORLD_SIZE"), 0)
    PHASE.pack_into(mm, PHASE_OFF, 0, 0, -1)


def discard_partial(fd: int, mm: "mmap.mmap | None", tmp: str) -> None:
    """Undo a ring file being built under the temporary name ``tmp``: unmap, close, unlink
    (each step best effort: this runs while an error propagates)."""
    if mm is not None:
        mm.close()
    os.close(fd)
    try:
        os.unlink(tmp)
    except OSError:
        pass


def anon_ring(nslots: int, strtab_size: int) -> "tuple[mmap.mmap, int]":
    """A ring in anonymous private memory, no file: ``(mmap, strtab_off)``, header and
    identity written as ``create_ring`` writes them but the process start time (0: filled
    in by ``ringsize.Growable`` before the ring goes to a file). A forked helper's ring
    starts so (issue 13); ``create_ring(..., content=)`` later writes it to its file."""
    strtab_off, total = layout(nslots, strtab_size)
    mm = mmap.mmap(-1, total, mmap.MAP_PRIVATE)
    HDR_FIXED.pack_into(mm, 0, MAGIC, VERSION, HEADER_SIZE, SLOT_SIZE, nslots, strtab_off, strtab_size)
    STRUSED.pack_into(mm, STRUSED_OFF, 8)
    _write_identity(mm, ticks=False)
    return mm, strtab_off


def create_ring(
    path: str,
    nslots: int,
    strtab_size: int = DEFAULT_STRTAB_SIZE,
    strtab_reserve: int = STRTAB_CHUNK,
    content: "bytes | None" = None,
) -> "tuple[int, mmap.mmap, int]":
    """Create a ring file and map it; return ``(fd, mmap, strtab_off)``.

    ``content``: the first bytes of the ring as built in memory (``anon_ring``: header,
    slots and the used part of the string table, within ``strtab_off + strtab_reserve``),
    written as they are instead of a fresh header and identity.

    The file is created with mode 0600, sized to its full length (sparse) and mapped
    ``MAP_SHARED``; header, slots and the first ``strtab_reserve`` bytes of the string
    table are reserved on disk at once. (The host name is ``os.uname().nodename``, the
    value ``socket.gethostname()`` returns on Linux, without importing socket.)

    It is built under a hidden temporary name (``.<name>.<pid>.creating``, which readers
    never glob) and appears under ``path`` only once its fixed header and the identity
    known at creation (pid, start time, host, run id, env rank) are written: a process
    killed while creating its ring leaves no half-made ring (no 'rank 0 :0 unknown').
    ``path`` is claimed exclusively (hard link; FileExistsError when it exists).
    Raises OSError (ENOSPC, EACCES, EEXIST ...) and leaves no file behind on failure.
    """
    import errno

    strtab_off, total = layout(nslots, strtab_size)
    d, _, name = path.rpartition("/")  # (POSIX paths; no os.path: runs in every forked child)
    tmp = "%s/.%s.%d.creating" % (d or ".", name, os.getpid())
    try:
        os.unlink(tmp)  # left by a killed process that had our pid
    except OSError:
        pass
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    mm = None
    try:
        os.ftruncate(fd, total)
        reserve(fd, 0, strtab_off + strtab_reserve)
        if content is None:
            _write_first_pages(fd, strtab_off, min(total, strtab_off + strtab_reserve))
        else:  # (pwrite, not stores through the mapping: see _write_first_pages)
            os.pwrite(fd, content, 0)
        mm = mmap.mmap(fd, total, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        if content is None:
            HDR_FIXED.pack_into(
                mm, 0, MAGIC, VERSION, HEADER_SIZE, SLOT_SIZE, nslots, strtab_off, strtab_size
            )
            STRUSED.pack_into(mm, STRUSED_OFF, 8)
            _write_identity(mm)
        try:
            os.link(tmp, path)  # atomic, exclusive: the complete header appears at once
        except FileExistsError:
            raise
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS, errno.EMLINK, errno.EXDEV):
                raise
            # no hard links on this file system: claim the name, then move the file over it
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            os.rename(tmp, path)
    except BaseException:
        discard_partial(fd, mm, tmp)
        raise
    try:
        os.unlink(tmp)
    except OSError:
        pass
    return fd, mm, strtab_off
