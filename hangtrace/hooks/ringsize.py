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

Standard library only: imported in every traced process.
"""
from __future__ import annotations

import mmap
import os
from typing import Any, Tuple

from hangtrace.tracer.ring import layout as F

#: String table of a small ring (bytes, apparent size; sparse) and the part reserved on
#: disk at creation (bytes). A helper's events (start with argv, exit, an exception with
#: up to 16 KB of traceback) fit; more grows the ring.
SMALL_STRTAB_SIZE = 256 << 10
SMALL_STRTAB_RESERVE = 16 << 10


def grow_file(path: str, old: Any, old_nslots: int, old_strtab_off: int, strtab_used: int,
              nslots: int) -> Tuple[int, mmap.mmap, int, int]:
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
        mm = mmap.mmap(fd, total, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        mm[0:F.HEADER_SIZE] = old[0:F.HEADER_SIZE]
        F.HDR_FIXED.pack_into(mm, 0, F.MAGIC, F.VERSION, F.HEADER_SIZE, F.SLOT_SIZE, nslots, strtab_off,
                              F.DEFAULT_STRTAB_SIZE)
        size = F.SLOT_SIZE
        for pos in range(old_nslots):
            o = F.HEADER_SIZE + pos * size
            (idx,) = F.U64.unpack_from(old, o)
            if idx and (idx - 1) % old_nslots == pos:
                n = F.HEADER_SIZE + (idx - 1) % nslots * size
                mm[n:n + size] = old[o:o + size]
        mm[strtab_off:strtab_off + strtab_used] = old[old_strtab_off:old_strtab_off + strtab_used]
        os.rename(tmp, path)
    except BaseException:
        if mm is not None:
            mm.close()
        os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return fd, mm, strtab_off, reserved
