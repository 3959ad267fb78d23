"""Timing rows of a ring summary's ``history`` (``ring/summary.py``): what the straggler
analysis reads, without a dict per record. Pure.

In: ``RingSummary.history`` - raw slots (``slotsummary.LazyRecords``, read field by field
here, only the slots asked for) or record dicts (synthetic snapshots, rings joined with
torch's Flight Recorder). Out: :class:`Row` tuples. Our collectives newer than a rank's
dump (``fr_unmatched``: ``ring/frrecords.merge_records`` gives them all the seq of the last
entry) keep our own seq, plus :data:`OURS`: every rank counts its Python calls alike, and
they sort after torch's numbers (a job analysed long after its dump has no other). Times are ns: ``t_wall_ns`` the Unix
epoch, ``t_mono_ns`` the writer host's CLOCK_MONOTONIC (0 when unknown: a Flight Recorder
entry), ``dur_ns`` issue to completion on one clock (-1 when unknown: still issued, async,
or a Flight Recorder entry).
"""

from __future__ import annotations

import struct
from typing import Any, List, NamedTuple, Optional, Sequence

from hangtrace.tracer.ring.layout import (
    K_COLL,
    K_PHASE_ENTER,
    K_PHASE_EXIT,
    K_STEP,
    OPS,
    S_COMPLETED,
    SLOT_SIZE,
)
from hangtrace.tracer.ring.layout import F_ASYNC

#: added to our own seq of a collective newer than the Flight Recorder dump (module docstring)
OURS = 1 << 40

_KIND = {K_COLL: "collective", K_PHASE_ENTER: "phase_enter", K_PHASE_EXIT: "phase_exit", K_STEP: "step"}


class Row(NamedTuple):
    """One collective, phase-enter/exit or step record (module docstring: units)."""

    kind: str
    group: Optional[str]
    seq: int
    step: Optional[int]
    phase: Optional[str]
    t_wall_ns: int
    t_mono_ns: int
    dur_ns: int
    op: str = ""
    numel: int = 0


#: the slot fields a row needs, from offset 8 (``layout.SLOT``): kind, flags, op, group,
#: seq, numel, phase, step, t_mono, t_wall, state, t_end - one unpack, no dict
_FIELDS = struct.Struct("<BBxBIqq4x4x4xIqQQB3x4xQ")


def _row_of_slot(raw: bytes, off: int, strings: Any) -> Row:
    kind, flags, op, group, seq, numel, phase, step, t_mono, t_wall, state, t_end = _unpack(raw, off + 8)
    return _new(
        Row,
        (
            _KIND[kind] if kind in _KIND else str(kind),
            strings.get(group, "") if group else None,
            seq,
            step if step >= 0 else None,
            strings.get(phase) if phase else None,
            t_wall,
            t_mono,
            t_end - t_mono if state == S_COMPLETED and t_end >= t_mono > 0 and not flags & F_ASYNC else -1,
            OPS[op] if op < _NOPS else str(op),
            numel,
        ),
    )


_unpack = _FIELDS.unpack_from
_new = tuple.__new__
_NOPS = len(OPS)


def _row_of_dict(r: Any) -> Row:
    seq = int(r.get("seq") or 0)
    if r.get("fr_unmatched"):  # ours, newer than the Flight Recorder dump: our own numbering, after torch's
        seq = OURS + int(r.get("seq_ours") or 0)
    t_mono, t_end = r.get("t_mono_ns") or 0, r.get("t_end_mono_ns") or 0
    done = r.get("state") == "completed" and t_end and t_mono and t_end >= t_mono and not r.get("async_op")
    return Row(
        str(r.get("kind")),
        r.get("group"),
        seq,
        r.get("step"),
        r.get("phase"),
        int(r.get("t_wall_ns") or 0),
        int(t_mono),
        int(t_end - t_mono) if done else -1,
        str(r.get("op") or ""),
        int(r.get("numel") or 0),
    )


def rows(history: Sequence[Any], kinds: Sequence[str] = (), newest: int = 0, skip: int = 0) -> List[Row]:
    """The rows of ``history`` of ``kinds`` (all when empty), newest first, at most
    ``newest`` of them (0 = all), the first ``skip`` of those left out (a reader that already
    has them: ``rows(h, k, n, skip=m)`` is ``rows(h, k, n)[m:]``). Raw slots are unpacked only
    for the rows returned."""
    raw = getattr(history, "_raw", None)
    out: List[Row] = []
    if isinstance(raw, bytes):
        strings = getattr(history, "_strings")
        want = {k for k, v in _KIND.items() if not kinds or v in kinds}
        kbytes = raw[8::SLOT_SIZE]
        pos = [i for i in range(len(kbytes) - 1, -1, -1) if kbytes[i] in want]
        return [
            _row_of_slot(raw, i * SLOT_SIZE, strings) for i in (pos[skip:newest] if newest else pos[skip:])
        ]
    for r in reversed(history):
        if not kinds or r.get("kind") in kinds:
            out.append(_row_of_dict(r))
            if newest and len(out) >= newest:
                break
    return out[skip:]
