"""Slots decoded as columns (``ring/slotcolumns.py``) are the dicts ``records.decode`` makes
of each slot: same keys in the same order, same values and types, for every record kind a
real Recorder writes (collectives, p2p with a peer and an error, async flags, groups,
phases, steps, heartbeats, memory samples), and for a slot of an unknown kind/op/state."""

import os
import struct

import numpy as np

from hangtrace.hooks.record import recorder as R
from hangtrace.tracer.ring import layout as F
from hangtrace.tracer.ring import reader as RD
from hangtrace.tracer.ring.records import decode
from hangtrace.tracer.ring.slotcolumns import decode_raw
from hangtrace.tracer.ring.slotsummary import LazyRecords


def _typed(records):
    return [[(k, type(v), v) for k, v in r.items()] for r in records]


def _write(tmp_path):
    rec = R.Recorder(str(tmp_path), "cols", 256, lambda *a, **k: None)
    rec.set_rank(1, 0, 2)
    rec.event("start", argv=["x"])
    rec.group_created({"op": "new_group", "name": "7", "ranks": [0, 1], "order": 0, "member": True})
    rec.phase_enter("train", step=3)
    g, s = rec.intern("7"), rec.intern("4x2")
    i = rec.issue(F.K_COLL, F.OP_IDS["all_reduce"], g, 1, 8, s, F.DTYPE_IDS["float32"], -1, 0)
    rec.complete(i)
    i = rec.issue(F.K_P2P, F.OP_IDS["isend"], g, 1, 8, s, F.DTYPE_IDS["int64"], 1, F.F_ASYNC)
    rec.complete(i, err="RuntimeError: Connection closed by peer")
    rec.issue(F.K_COLL, F.OP_IDS["broadcast"], g, 2, -1, 0, F.DTYPE_IDS["object"], 0, 0)
    rec.phase_exit("train", error="ValueError: x")
    for n in range(9, 20):  # (16 records or more: LazyRecords decodes them as columns)
        rec.step(n)
    rec.heartbeat()
    if hasattr(rec, "memory"):
        rec.memory(1, rec.intern("host"), 10, 20, 30, 0, -1)
        rec.memory(3, rec.intern("cuda:0"), -1, 2**40, 5, 6, 7)
    return [os.path.join(tmp_path, f) for f in os.listdir(tmp_path) if f.endswith(".htr")][0]


def test_columns_decode_as_decode_does(tmp_path):
    path = _write(tmp_path)
    ring = RD.read_ring(path, records=True)
    with open(path, "rb") as f:
        f.seek(F.HEADER_SIZE)
        raw = f.read(len(ring.records) * F.SLOT_SIZE)
    one = [decode(t, ring.strings) for t in F.SLOT.iter_unpack(raw)]
    assert {r["kind"] for r in one} >= {"collective", "p2p", "group", "phase_enter", "step", "event"}
    assert _typed(decode_raw(np, raw, ring.strings)) == _typed(one)
    assert len(one) >= 16
    assert _typed(list(LazyRecords(raw, ring.strings))) == _typed(one)


def test_unknown_codes_and_strings_decode_alike():
    strings = {5: "g"}
    slot = bytearray(F.SLOT_SIZE)
    F.SLOT.pack_into(slot, 0, 3, 200, 3, 250, 251, 5, -4, 2, 99, -1, 77, 0, -7, 1, 2, 9, 88, 0, 1, 2, 3, 4, 5)
    mem = bytearray(F.SLOT_SIZE)
    F.SLOT.pack_into(mem, 0, 4, F.K_MEM, 0, 0, 200, 0, 0, 0, 0, 0, 0, 5, 2, 1, 2, 0, 0, 0, -1, -1, -1, -1, -1)
    raw = bytes(slot + mem)
    one = [decode(t, strings) for t in struct.Struct(F.SLOT.format).iter_unpack(raw)]
    assert _typed(decode_raw(np, raw, strings)) == _typed(one)
