"""Record types of the ring file, as the reader decodes them (one dict per slot).

In: slot bytes (``layout.SLOT``) and the ring's string table. Out: record dicts
(:func:`decode` one slot, :func:`decode_slots` a slot array's valid window).

Every slot kind but memory decodes to a :class:`SlotRecord` (the keys the analysis has
always read); the kind aliases below only say which ``kind`` value a record carries. A
memory sample (kind ``'memory'``) reuses the generic slot fields on disk (see
``ring/layout.py``) but decodes to its own :class:`MemorySample`: ``source`` and ``what``
instead of ``op`` and ``group``, so it never shows a collective name.

Times are ns (``t_mono_ns``: the writer host's CLOCK_MONOTONIC; ``t_wall_ns``: Unix
epoch). Sizes are elements (``numel``); memory values are bytes. Format: docs/FORMAT.md.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Tuple, TypedDict, Union

from hangtrace.tracer.ring.layout import (
    DTYPES,
    F_ASYNC,
    F_BATCH,
    K_MEM,
    KIND_NAMES,
    MEM_SOURCES,
    OPS,
    SLOT,
    SLOT_SIZE,
    STATE_NAMES,
)

#: one slot unpacked with ``layout.SLOT`` (23 fields, in struct order)
SlotTuple = Tuple[
    int,
    int,
    int,
    int,
    int,
    int,
    int,
    int,
    int,
    int,
    int,
    int,
    int,
    int,
    int,
    int,
    int,
    int,
    int,
    int,
    int,
    int,
    int,
]


class SlotRecord(TypedDict):
    """A collective, p2p, group, phase, step, heartbeat or event record.

    ``kind``: 'collective' | 'p2p' | 'group' | 'phase_enter' | 'phase_exit' | 'step' |
    'heartbeat' | 'event'; ``op``: operation name (``layout.OPS``); ``group``: process
    group name (None when the slot has none); ``seq``: per-group sequence number (p2p:
    per (group, peer); step records: the step); ``peer``: global rank (-1 none);
    ``state``: 'issued' | 'completed' | 'failed'; ``a``: the five raw argument words.
    """

    idx: int
    kind: str
    op: str
    group: Optional[str]
    seq: int
    dtype: str
    numel: int
    shape: Optional[str]
    peer: int
    async_op: bool
    batch: bool
    thread: Optional[str]
    phase: Optional[str]
    step: Optional[int]
    t_mono_ns: int
    t_wall_ns: int
    t_end_mono_ns: Optional[int]
    state: str
    error: Optional[str]
    a: Tuple[int, int, int, int, int]


# The kinds share one shape; the names document which ``kind`` a value carries.
CollectiveRecord = SlotRecord
P2PRecord = SlotRecord
GroupRecord = SlotRecord
PhaseRecord = SlotRecord
StepRecord = SlotRecord
EventRecord = SlotRecord


class MemorySample(TypedDict):
    """A memory sample (kind 'memory', writer ``hooks/mem/sampler.py``).

    ``source``: 'timer' | 'phase_enter' | 'phase_exit' | 'step' | 'oom';
    ``what``: 'host' | 'cuda:N' | 'gauge:<name>'; ``a``: five values, bytes or counts,
    -1 = unknown (meaning per ``what``: docs/MEMORY.md, ``ring/layout.py``).
    """

    idx: int
    kind: str
    source: str
    what: str
    thread: Optional[str]
    phase: Optional[str]
    step: Optional[int]
    t_mono_ns: int
    t_wall_ns: int
    a: Tuple[int, int, int, int, int]


Record = Union[SlotRecord, MemorySample]


def decode(t: SlotTuple, strings: Mapping[int, str]) -> Record:
    """One unpacked slot -> its record dict. ``strings``: the ring's {strid: text}."""
    (
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
        thread,
        phase,
        step,
        t_mono,
        t_wall,
        state,
        err,
        t_end,
        a0,
        a1,
        a2,
        a3,
        a4,
    ) = t
    S = strings.get
    if kind == K_MEM:
        return MemorySample(
            idx=idx,
            kind="memory",
            source=MEM_SOURCES[op] if 0 < op < len(MEM_SOURCES) else str(op),
            what=S(group, "") or "?" if group else "?",
            thread=S(thread) if thread else None,
            phase=S(phase) if phase else None,
            step=step if step >= 0 else None,
            t_mono_ns=t_mono,
            t_wall_ns=t_wall,
            a=(a0, a1, a2, a3, a4),
        )
    return SlotRecord(
        idx=idx,
        kind=KIND_NAMES.get(kind, str(kind)),
        op=OPS[op] if op < len(OPS) else str(op),
        group=S(group, "") if group else None,
        seq=seq,
        dtype=DTYPES[dtype] if dtype < len(DTYPES) else str(dtype),
        numel=numel,
        shape=S(shape) if shape else None,
        peer=peer,
        async_op=bool(flags & F_ASYNC),
        batch=bool(flags & F_BATCH),
        thread=S(thread) if thread else None,
        phase=S(phase) if phase else None,
        step=step if step >= 0 else None,
        t_mono_ns=t_mono,
        t_wall_ns=t_wall,
        t_end_mono_ns=t_end or None,
        state=STATE_NAMES.get(state, str(state)),
        error=S(err) if err else None,
        a=(a0, a1, a2, a3, a4),
    )


def decode_slots(slots: bytes, nslots: int, strings: Dict[int, str]) -> List[Record]:
    """Decode the valid slots of ``slots`` (bytes) into record dicts ordered by index
    (``ring/records.py``: a SlotRecord, or a MemorySample for memory records).

    A slot is valid when its stored index maps to its own position; of the valid ones,
    only the newest ``nslots`` window is kept (older leftovers of a torn write are dropped).
    """
    out = []
    # First only the 8-byte index of every slot (one C-level pass), then unpack just the
    # valid ones: an unfilled ring costs almost nothing.
    idxs = memoryview(slots).cast("B").cast("Q")[:: SLOT_SIZE // 8].tolist()
    unpack = SLOT.unpack_from
    for pos, idx in enumerate(idxs):
        if idx and (idx - 1) % nslots == pos:
            out.append(unpack(slots, pos * SLOT_SIZE))
    out.sort(key=lambda r: r[0])
    if out:
        newest = out[-1][0]
        out = [r for r in out if r[0] > newest - nslots]
    return [decode(t, strings) for t in out]
