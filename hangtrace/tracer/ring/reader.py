"""Reading ring files: header validation, string table, slot decoding (the read side of
``ring/layout.py``). Used by collection and ``hangtrace records``; never by traced processes.

:func:`read_ring` decodes every record (``hangtrace records``); :func:`read_ring_summary`
reads the same file into a :class:`~hangtrace.tracer.ring.summary.RingSummary` without a
dict per record (collection: 4,096 ranks x 2,000 records in seconds)."""

from __future__ import annotations

import os

from typing import Any, Dict, List, Optional

from hangtrace.tracer.ring.layout import (
    EXIT,
    EXIT_OFF,
    HDR_FIXED,
    HEADER_SIZE,
    HOST_LEN,
    HOST_OFF,
    IDENT,
    IDENT_OFF,
    LIVE_DONE,
    LIVE_DONE_OFF,
    LIVE_ISSUE,
    LIVE_ISSUE_OFF,
    MAGIC,
    PHASE,
    PHASE_OFF,
    RANK,
    RANK_OFF,
    RANK_SOURCE,
    RANK_SOURCE_OFF,
    RUNID_LEN,
    RUNID_OFF,
    SLOT_SIZE,
    STRUSED,
    STRUSED_OFF,
    STR_ENTRY,
    T_EVENT,
    T_GROUP,
    T_META,
    T_STR,
    VERSION,
)
from hangtrace.tracer.ring.records import Record, decode_slots
from hangtrace.tracer.ring.slotsummary import summarize_slots
from hangtrace.tracer.ring.summary import RingSummary, summarize_records


# --- reading ----------------------------------------------------------------------
class RingData:
    """Decoded content of one ring file (plain attributes, no mmap kept).

    ``records``: list of dicts ordered by record index (``ring/records.py``; empty when
    read with ``records=False``); ``summary``: the :class:`RingSummary`; ``strings``: {strid: str};
    ``groups``: group definitions in creation order; ``events``: lifecycle events;
    ``meta``: merged identity updates (Ray actor, ...); ``header``: dict of header fields;
    ``warnings``: problems found that did not stop the read (e.g. a torn string table).
    """

    __slots__ = ("path", "header", "records", "summary", "strings", "groups", "events", "meta", "warnings")

    def __init__(self, path: Any) -> None:
        self.path = str(path)
        self.header: Dict[str, Any] = {}
        self.records: List[Record] = []
        self.summary: RingSummary = RingSummary()
        self.strings: Dict[int, str] = {}
        self.groups: List[Dict[str, Any]] = []
        self.events: List[Dict[str, Any]] = []
        self.meta: Dict[str, Any] = {}
        self.warnings: List[str] = []


def _cstr(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def read_header(buf: Any, path: str = "<buffer>") -> Dict[str, Any]:
    """Validate and decode the header of ``buf`` (bytes-like, >= HEADER_SIZE bytes).

    Returns a dict. Raises TruncatedRingError, ForeignFileError, UnsupportedVersionError
    or CorruptRingError naming ``path``.
    """
    from hangtrace.tracer.errors import (
        CorruptRingError,
        ForeignFileError,
        TruncatedRingError,
        UnsupportedVersionError,
    )

    if len(buf) < 8:
        if bytes(buf) != MAGIC[: len(buf)]:  # a short file of other content is not ours
            raise ForeignFileError(path, "no hangtrace magic (found %r)" % bytes(buf))
        raise TruncatedRingError(path, "%d bytes, shorter than the 8-byte magic" % len(buf))
    if bytes(buf[:6]) != MAGIC[:6]:
        raise ForeignFileError(path, "no hangtrace magic (found %r)" % bytes(buf[:8]))
    if bytes(buf[:8]) != MAGIC:
        raise UnsupportedVersionError(path, "ring format %r, this reader knows %r" % (bytes(buf[:8]), MAGIC))
    if len(buf) < HEADER_SIZE:
        raise TruncatedRingError(path, "%d bytes, shorter than the %d-byte header" % (len(buf), HEADER_SIZE))
    magic, version, hsize, ssize, nslots, stroff, strsize = HDR_FIXED.unpack_from(buf, 0)
    if version != VERSION:
        raise UnsupportedVersionError(path, "format version %d, this reader knows %d" % (version, VERSION))
    if (
        hsize != HEADER_SIZE
        or ssize != SLOT_SIZE
        or nslots <= 0
        or stroff != HEADER_SIZE + nslots * SLOT_SIZE
    ):
        raise CorruptRingError(
            path,
            "inconsistent sizes (header %d, slot %d, slots %d, strtab at %d)"
            % (hsize, ssize, nslots, stroff),
        )
    pid, ppid, start_wall, start_mono, ticks = IDENT.unpack_from(buf, IDENT_OFF)
    next_idx, inflight = LIVE_ISSUE.unpack_from(buf, LIVE_ISSUE_OFF)
    _, pmono, pwall, pcount = LIVE_DONE.unpack_from(buf, LIVE_DONE_OFF)
    phase, depth, step = PHASE.unpack_from(buf, PHASE_OFF)
    (strused,) = STRUSED.unpack_from(buf, STRUSED_OFF)
    state, exit_code, exit_wall = EXIT.unpack_from(buf, EXIT_OFF)
    rank, local_rank, world, dumpsig = RANK.unpack_from(buf, RANK_OFF)
    return dict(
        version=version,
        nslots=nslots,
        strtab_off=stroff,
        strtab_size=strsize,
        pid=pid,
        ppid=ppid,
        start_wall_ns=start_wall,
        start_mono_ns=start_mono,
        proc_start_ticks=ticks,
        host=_cstr(buf[HOST_OFF : HOST_OFF + HOST_LEN]),
        run_id=_cstr(buf[RUNID_OFF : RUNID_OFF + RUNID_LEN]),
        next_idx=next_idx,
        inflight_idx=inflight,
        progress_mono_ns=pmono,
        progress_wall_ns=pwall,
        progress_count=pcount,
        phase_strid=phase,
        phase_depth=depth,
        step=step,
        strtab_used=strused,
        state=state,
        exit_code=exit_code,
        exit_wall_ns=exit_wall,
        rank=rank,
        local_rank=local_rank,
        world_size=world,
        dump_signal=dumpsig,
        rank_source=RANK_SOURCE.unpack_from(buf, RANK_SOURCE_OFF)[0],
    )


#: group definitions by their JSON text, shared by the rings of one read: every rank of a
#: 4,096-rank job stores the world group's 4,096-rank list (about 600 MiB as 4,096 lists
#: of ints). Readers must not modify a ``RingData.groups`` entry.
_GROUPS: Dict[str, Any] = {}


def _parse_strtab(data: bytes, used: int, ring: RingData) -> None:
    import json

    off = 8
    end = min(used, len(data))
    if used > len(data):
        ring.warnings.append("string table cut short: %d of %d bytes present" % (len(data), used))
    while off + STR_ENTRY.size <= end:
        tag, n = STR_ENTRY.unpack_from(data, off)
        if tag not in (T_STR, T_GROUP, T_EVENT, T_META) or off + STR_ENTRY.size + n > end:
            ring.warnings.append(
                "string table corrupt at byte %d; %d bytes after it ignored" % (off, end - off)
            )
            break
        text = bytes(data[off + STR_ENTRY.size : off + STR_ENTRY.size + n]).decode("utf-8", "replace")
        if tag == T_STR:
            ring.strings[off] = text
        else:
            try:
                obj = _GROUPS.get(text) if tag == T_GROUP else None
                if obj is None:
                    obj = json.loads(text)
                    if tag == T_GROUP and isinstance(obj, dict) and len(text) > 256:
                        if len(_GROUPS) >= 1024:
                            _GROUPS.clear()
                        _GROUPS[text] = obj
            except ValueError:
                ring.warnings.append(
                    "unreadable %s entry at byte %d"
                    % ({T_GROUP: "group", T_EVENT: "event", T_META: "meta"}[tag], off)
                )
                obj = None
            if isinstance(obj, dict):
                if tag == T_GROUP:
                    ring.groups.append(obj)
                elif tag == T_EVENT:
                    ring.events.append(obj)
                else:
                    ring.meta.update(obj)
        off += STR_ENTRY.size + n


def _written_len(fd: int, slots_len: int) -> int:
    """How many bytes of the slot array (``slots_len`` bytes from HEADER_SIZE) to read: up to
    the file's first hole when no data follows it within the array (a ring not yet wrapped:
    its never-written slots are a hole of the sparse file the recorder created, and read as
    zeros), else all. A 48k-slot rank ring holding 1,300 records is read as 170 KB instead of
    6 MiB (issue 40: at 4,096 ranks, 8.4 GiB read). File systems without SEEK_HOLE, and
    rings copied densely, read whole."""
    end = HEADER_SIZE + slots_len
    try:
        hole = os.lseek(fd, HEADER_SIZE, os.SEEK_HOLE)
        if hole >= end:
            return slots_len
        try:
            more = os.lseek(fd, hole, os.SEEK_DATA)
        except OSError:  # ENXIO: no data after the hole
            more = end
        return hole - HEADER_SIZE if more >= end else slots_len
    except (OSError, AttributeError):
        return slots_len
    finally:
        os.lseek(fd, HEADER_SIZE, os.SEEK_SET)


def read_ring(path: Any, records: bool = True, use_numpy: Optional[bool] = None) -> RingData:
    """Read and decode a ring file. Returns RingData with its ``summary``.

    ``records``: True decodes every record into ``RingData.records`` (and summarises that
    list); False decodes only the summary's records (``summarize_slots``, numpy when
    available or ``use_numpy`` says so) and leaves ``records`` empty.

    Accepts files cut after the used part of the string table (snapshots store them so).
    Raises a RingFormatError subclass naming ``path`` for truncated, foreign, other-version
    or inconsistent files; OSError when the file cannot be opened.
    """
    from hangtrace.tracer.errors import TruncatedRingError

    ring = RingData(path)
    # unbuffered: the hole query (``_written_len``) moves the descriptor's offset, which a
    # buffered reader would not know of (with a read-ahead larger than the header, as on a
    # file system with a large block size, it would then read the slots from the wrong place)
    with open(path, "rb", buffering=0) as f:
        head = f.read(HEADER_SIZE)
        hdr = read_header(head, path)
        slots_len = hdr["nslots"] * SLOT_SIZE
        if HEADER_SIZE + slots_len > os.fstat(f.fileno()).st_size:  # before allocating slots_len
            raise TruncatedRingError(
                path,
                "%d of %d slot bytes present"
                % (max(0, os.fstat(f.fileno()).st_size - HEADER_SIZE), slots_len),
            )
        want = _written_len(f.fileno(), slots_len)
        slots = f.read(want)
        if len(slots) < want:
            raise TruncatedRingError(path, "%d of %d slot bytes present" % (len(slots), slots_len))
        f.seek(HEADER_SIZE + slots_len)
        used = hdr["strtab_used"]
        if used > hdr["strtab_size"]:
            ring.warnings.append("string table use %d > size %d" % (used, hdr["strtab_size"]))
            used = hdr["strtab_size"]
        strtab = f.read(used)
    ring.header = hdr
    _parse_strtab(strtab, used, ring)
    ring.header["phase"] = ring.strings.get(hdr["phase_strid"]) if hdr["phase_strid"] else None
    if records:
        ring.records = decode_slots(slots, hdr["nslots"], ring.strings)
        ring.summary = summarize_records(ring.records, hdr["inflight_idx"])
    else:
        ring.summary = summarize_slots(
            slots, hdr["nslots"], ring.strings, hdr["inflight_idx"], use_numpy=use_numpy
        )
    return ring


def read_ring_summary(path: Any, use_numpy: Optional[bool] = None) -> RingData:
    """:func:`read_ring` without the full record list (``records`` stays empty)."""
    return read_ring(path, records=False, use_numpy=use_numpy)


def compact_copy(src: str, dst: str) -> int:
    """Copy the used part of ring ``src`` (header, slots, used string table) to ``dst``.

    Returns bytes written. Raises OSError or RingFormatError.
    """
    with open(src, "rb") as f:
        head = f.read(HEADER_SIZE)
        hdr = read_header(head, src)
        rest = f.read(hdr["nslots"] * SLOT_SIZE + hdr["strtab_used"])
    with open(dst, "wb") as g:
        g.write(head)
        g.write(rest)
    return len(head) + len(rest)


def snapshot_copy(src: str, dst: str, frozen: bool = False) -> int:
    """Store ring ``src`` in a snapshot as ``dst`` without copying what need not be copied
    (issue 40: each snapshot copied ~2 MiB per process).

    ``frozen`` (the writer exited or died; a new process of the same pid writes a new file,
    ``layout.create`` renames a new inode into place): a hard link, when the file system
    allows one. Else the used part as ``compact_copy`` writes it, but with the slots after
    the last written one (a ring that has not wrapped) left as a hole: the file reads the same, costs
    only what was recorded. Returns bytes written (0 for a link). Raises OSError or
    RingFormatError.
    """
    if frozen:
        try:
            os.link(src, dst)
            return 0
        except OSError:
            pass
    with open(src, "rb") as f:
        head = f.read(HEADER_SIZE)
        hdr = read_header(head, src)
        slots = f.read(hdr["nslots"] * SLOT_SIZE)
        tab = f.read(hdr["strtab_used"])
    n = len(slots.rstrip(b"\0"))  # slots past the last written byte were never written
    slots = slots[: -(-n // SLOT_SIZE) * SLOT_SIZE]
    with open(dst, "wb") as g:
        g.write(head)
        g.write(slots)
        g.seek(hdr["strtab_off"])
        g.write(tab)
    return len(head) + len(slots) + len(tab)
