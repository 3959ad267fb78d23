"""Many slots of one ring decoded at once: numpy reads each field as a column and the
record dicts are made in one comprehension, each the dict ``records.decode`` makes of its
slot (same keys in the same order, same values and types). Pure.

Half of a rank ring's records are memory samples and its history and tail are read whole
by the Flight Recorder join: decoded one slot at a time (``struct`` unpack, then a
``TypedDict`` call) they were most of reading 512 ranks' rings (issue 40). Needs numpy
(callers have it: ``slotsummary._summarize_np``).
"""

from __future__ import annotations

from typing import Any, List, Mapping

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
from hangtrace.tracer.ring.records import Record

#: (field, numpy format, byte offset) of ``layout.SLOT``, in ``records.decode``'s order
_LAYOUT = (
    ("idx", "<u8", 0),
    ("kind", "u1", 8),
    ("flags", "u1", 9),
    ("dtype", "u1", 10),
    ("op", "u1", 11),
    ("group", "<u4", 12),
    ("seq", "<i8", 16),
    ("numel", "<i8", 24),
    ("shape", "<u4", 32),
    ("peer", "<i4", 36),
    ("thread", "<u4", 40),
    ("phase", "<u4", 44),
    ("step", "<i8", 48),
    ("t_mono", "<u8", 56),
    ("t_wall", "<u8", 64),
    ("state", "u1", 72),
    ("err", "<u4", 76),
    ("t_end", "<u8", 80),
    ("a", ("<i8", (5,)), 88),
)
_DTYPE: Any = None


def slot_dtype(np: Any) -> Any:
    """numpy structured dtype of one slot (every field of ``layout.SLOT``)."""
    global _DTYPE
    if _DTYPE is None:
        assert SLOT.size == SLOT_SIZE
        _DTYPE = np.dtype(
            {
                "names": [f[0] for f in _LAYOUT],
                "formats": [f[1] for f in _LAYOUT],
                "offsets": [f[2] for f in _LAYOUT],
                "itemsize": SLOT_SIZE,
            }
        )
    return _DTYPE


def decode_rows(rows: Any, strings: Mapping[int, str]) -> List[Record]:
    """The record dicts of ``rows`` (a structured array of :func:`slot_dtype`), in order."""
    get = strings.get
    nsrc, nops, ndt = len(MEM_SOURCES), len(OPS), len(DTYPES)
    out: List[Any] = []
    add = out.append
    for idx, kind, fl, dt, op, g, seq, numel, sh, peer, th, ph, st, tm, tw, state, err, te, a in zip(
        *(rows[f[0]].tolist() for f in _LAYOUT)
    ):
        if kind == K_MEM:
            add(
                {
                    "idx": idx,
                    "kind": "memory",
                    "source": MEM_SOURCES[op] if 0 < op < nsrc else str(op),
                    "what": (get(g, "") or "?") if g else "?",
                    "thread": get(th) if th else None,
                    "phase": get(ph) if ph else None,
                    "step": st if st >= 0 else None,
                    "t_mono_ns": tm,
                    "t_wall_ns": tw,
                    "a": tuple(a),
                }
            )
            continue
        add(
            {
                "idx": idx,
                "kind": KIND_NAMES.get(kind, str(kind)),
                "op": OPS[op] if op < nops else str(op),
                "group": get(g, "") if g else None,
                "seq": seq,
                "dtype": DTYPES[dt] if dt < ndt else str(dt),
                "numel": numel,
                "shape": get(sh) if sh else None,
                "peer": peer,
                "async_op": bool(fl & F_ASYNC),
                "batch": bool(fl & F_BATCH),
                "thread": get(th) if th else None,
                "phase": get(ph) if ph else None,
                "step": st if st >= 0 else None,
                "t_mono_ns": tm,
                "t_wall_ns": tw,
                "t_end_mono_ns": te or None,
                "state": STATE_NAMES.get(state, str(state)),
                "error": get(err) if err else None,
                "a": tuple(a),
            }
        )
    return out


def decode_raw(np: Any, raw: bytes, strings: Mapping[int, str]) -> List[Record]:
    """The record dicts of ``raw`` (whole slots, 128 bytes each), in order."""
    return decode_rows(np.frombuffer(raw, dtype=slot_dtype(np), count=len(raw) // SLOT_SIZE), strings)
