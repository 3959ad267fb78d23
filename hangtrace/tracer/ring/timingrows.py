"""Timing rows of a ring summary's ``history`` (``ring/summary.py``): what the straggler
analysis reads, without a dict per record. Pure.

In: ``RingSummary.history`` - raw slots (``slotsummary.LazyRecords``, read field by field
here, only the slots asked for) or record dicts (synthetic snapshots, rings joined with
torch's Flight Recorder; our collectives newer than the dump, ``fr_unmatched``, are left
out: ``ring/frrecords.merge_records`` numbers them all after the last entry, so their seq
is no instance any other rank shares). Out: :class:`Row` tuples. Times are ns: ``t_wall_ns`` the Unix
epoch, ``t_mono_ns`` the writer host's CLOCK_MONOTONIC (0 when unknown: a Flight Recorder
entry), ``dur_ns`` issue to completion on one clock (-1 when unknown: still issued, async,
or a Flight Recorder entry).
"""

from __future__ import annotations

from typing import Any, List, NamedTuple, Optional, Sequence

from hangtrace.tracer.ring.layout import (
    K_COLL,
    K_PHASE_ENTER,
    K_PHASE_EXIT,
    K_STEP,
    S_COMPLETED,
    SLOT,
    SLOT_SIZE,
)
from hangtrace.tracer.ring.layout import F_ASYNC

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


def _row_of_slot(t: Any, strings: Any) -> Row:
    kind, flags, group, seq, phase, step, t_mono, t_wall, state, t_end = (
        t[1],
        t[2],
        t[5],
        t[6],
        t[11],
        t[12],
        t[13],
        t[14],
        t[15],
        t[17],
    )
    done = state == S_COMPLETED and t_end and t_end >= t_mono and not flags & F_ASYNC
    return Row(
        _KIND.get(kind, str(kind)),
        strings.get(group, "") if group else None,
        seq,
        step if step >= 0 else None,
        strings.get(phase) if phase else None,
        t_wall,
        t_mono,
        t_end - t_mono if done else -1,
    )


def _row_of_dict(r: Any) -> Row:
    t_mono, t_end = r.get("t_mono_ns") or 0, r.get("t_end_mono_ns") or 0
    done = r.get("state") == "completed" and t_end and t_mono and t_end >= t_mono and not r.get("async_op")
    return Row(
        str(r.get("kind")),
        r.get("group"),
        int(r.get("seq") or 0),
        r.get("step"),
        r.get("phase"),
        int(r.get("t_wall_ns") or 0),
        int(t_mono),
        int(t_end - t_mono) if done else -1,
    )


def rows(history: Sequence[Any], kinds: Sequence[str] = (), newest: int = 0) -> List[Row]:
    """The rows of ``history`` of ``kinds`` (all when empty), newest first, at most
    ``newest`` of them (0 = all). Raw slots are unpacked only for the rows returned."""
    raw = getattr(history, "_raw", None)
    out: List[Row] = []
    if isinstance(raw, bytes):
        strings = getattr(history, "_strings")
        want = {k for k, v in _KIND.items() if not kinds or v in kinds}
        kbytes = raw[8::SLOT_SIZE]
        for i in range(len(kbytes) - 1, -1, -1):
            if kbytes[i] in want:
                out.append(_row_of_slot(SLOT.unpack_from(raw, i * SLOT_SIZE), strings))
                if newest and len(out) >= newest:
                    break
        return out
    for r in reversed(history):
        if r.get("fr_unmatched"):
            continue  # ours, newer than the rank's Flight Recorder dump: its seq is not torch's
        if not kinds or r.get("kind") in kinds:
            out.append(_row_of_dict(r))
            if newest and len(out) >= newest:
                break
    return out
