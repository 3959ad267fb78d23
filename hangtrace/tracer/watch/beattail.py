"""Was a ring's move only heartbeats? The watcher's reader of a ring's newest slots.

In: a ring path, its header now and the signature it had at the last poll. Out: True when
every record written since is a heartbeat's enter or exit or neutral (``ring/heartbeats.py``:
a framework's periodic, quick, empty call such as Ray Train's ``poll_status``; at least one
of them), so the move
proves the process alive and not that the job progressed. Only moves that could be that are
read: same step, same state, at most :data:`MAX_MOVE` progress events; the slots are read
forward from the last record seen (one ``pread``), the newest record found by a binary search
over the slot indices when the position is unknown. Never raises (a ring it cannot read moved).
"""

from __future__ import annotations

import os
from typing import Dict, Mapping, Optional, Tuple

from hangtrace.tracer.ring import layout as F
from hangtrace.tracer.ring.heartbeats import HeartbeatBook

#: largest progress-count move read for heartbeats (a heartbeat call is 2 events; a poll of
#: 3.75 s sees at most a few calls)
MAX_MOVE = 16
#: slots read forward at most per look (records of a heartbeat move plus memory samples)
MAX_SLOTS = 256

Sig = Tuple[int, int, int, int]  # (progress_count, phase strid, step, state)


def _idx_at(fd: int, pos: int) -> int:
    b = os.pread(fd, 8, F.HEADER_SIZE + pos * F.SLOT_SIZE)
    return int.from_bytes(b, "little") if len(b) == 8 else 0


def newest_idx(fd: int, nslots: int) -> int:
    """The newest record index of the ring open as ``fd`` (0: none): slots hold increasing
    indices from position 0 up to the newest, then older ones or zeros."""
    first = _idx_at(fd, 0)
    if not first:
        return 0
    lo, hi = 0, nslots - 1  # pred(lo) holds
    while lo < hi:
        mid = (lo + hi + 1) // 2
        i = _idx_at(fd, mid)
        if i and i >= first:
            lo = mid
        else:
            hi = mid - 1
    return _idx_at(fd, lo)


class BeatTail:
    """Per ring: the last record index read and its :class:`HeartbeatBook`."""

    def __init__(self) -> None:
        self.last: Dict[str, int] = {}
        self.books: Dict[str, HeartbeatBook] = {}

    def heartbeat_only(self, path: str, h: Mapping[str, object], old: Optional[Sig], sig: Sig) -> bool:
        """True when the move of ``path`` from ``old`` to ``sig`` was only heartbeats."""
        try:
            return self._look(path, h, old, sig)
        except Exception:
            self.last.pop(path, None)
            return False

    def _look(self, path: str, h: Mapping[str, object], old: Optional[Sig], sig: Sig) -> bool:
        nslots = int(h.get("nslots") or 0)  # type: ignore[call-overload]
        plausible = old is not None and old[2:] == sig[2:] and 0 <= sig[0] - old[0] <= MAX_MOVE and nslots > 0
        fd = os.open(path, os.O_RDONLY)
        try:
            last = self.last.get(path)
            if last is None or not plausible:
                self.last[path] = newest_idx(fd, nslots) if nslots else 0
                return False
            return self._read_forward(fd, path, last, nslots)
        finally:
            os.close(fd)

    def _read_forward(self, fd: int, path: str, last: int, nslots: int) -> bool:
        book = self.books.setdefault(path, HeartbeatBook())
        n = min(MAX_SLOTS, nslots)
        pos = last % nslots  # record idx i lives at (i - 1) % nslots
        first = os.pread(fd, min(n, nslots - pos) * F.SLOT_SIZE, F.HEADER_SIZE + pos * F.SLOT_SIZE)
        rest = os.pread(fd, (n - (nslots - pos)) * F.SLOT_SIZE, F.HEADER_SIZE) if n > nslots - pos else b""
        data = first + rest
        beats_only, beat, want, seen = True, False, last + 1, 0
        for off in range(0, len(data) - F.SLOT_SIZE + 1, F.SLOT_SIZE):
            t = F.SLOT.unpack_from(data, off)
            if t[0] != want:
                break
            kind = F.KIND_NAMES.get(t[1], str(t[1]))
            if book.feed(kind, t[11] or None, t[10], t[13], failed=t[15] == F.S_FAILED):
                beats_only = False
            elif kind in ("phase_enter", "phase_exit"):
                beat = True
            want, seen = want + 1, seen + 1
        if seen == n:  # more than one look holds: work, and find the newest again next time
            self.last.pop(path, None)
            return False
        self.last[path] = want - 1
        # a move with no heartbeat in it (its records neutral, or none: a progress event
        # without a record) is progress, as before
        return beats_only and beat
