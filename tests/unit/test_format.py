"""Ring file format: written by the real Recorder, read back by format.read_ring.

Also: ring wrap, late completions, every kind of unreadable file (the right error,
naming the file), and what `hangtrace records` / collect.load_run make of them.
"""

import json
import os
import socket
import time

import pytest

from hangtrace import cli
from hangtrace.hooks.record.recorder import Recorder
from hangtrace.tracer import errors as E
from hangtrace.tracer.ring import layout as F
from hangtrace.tracer.ring import reader as R
from hangtrace.tracer.collect.rings import load_run


class Log:
    """The recorder's log callable: keeps (msg, key) pairs."""

    def __init__(self):
        self.lines = []

    def __call__(self, msg, key=None):
        self.lines.append((msg, key))


@pytest.fixture
def rec(tmp_path):
    r = Recorder(str(tmp_path), "run-xyz", 64, Log())
    yield r
    r.close()


def coll(rec, seq, numel=1, group="g", flags=0):
    return rec.issue(
        F.K_COLL,
        F.OP_IDS["all_reduce"],
        rec.intern(group),
        seq,
        numel,
        rec.intern("1"),
        F.DTYPE_IDS["float32"],
        -1,
        flags,
    )


def proc_start_ticks():
    with open("/proc/self/stat", "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[19])


def test_round_trip_of_every_field(rec, monkeypatch):
    t0 = time.time_ns()
    rec.set_rank(3, 1, 8)
    rec.set_dump_signal(12)
    rec.set_meta(actor_class="Trainer", actor_id="abc")
    rec.set_meta(actor_name="trainer_3")
    rec.event("start", argv=["x.py", "--y"], ppid=os.getppid())
    rec.group_created(
        {
            "op": "new_group",
            "name": "7",
            "desc": "tp",
            "backend": "gloo",
            "ranks": [2, 3],
            "order": 1,
            "member": True,
        }
    )
    rec.phase_enter("train", step=5)
    i1 = rec.issue(
        F.K_COLL,
        F.OP_IDS["all_gather"],
        rec.intern("7"),
        42,
        12,
        rec.intern("3x4"),
        F.DTYPE_IDS["bfloat16"],
        -1,
        F.F_ASYNC,
    )
    rec.complete(i1)
    i2 = rec.issue(
        F.K_P2P,
        F.OP_IDS["irecv"],
        rec.intern("0"),
        9,
        6,
        rec.intern("6"),
        F.DTYPE_IDS["int64"],
        2,
        F.F_ASYNC | F.F_BATCH,
    )
    rec.complete(i2, err="RuntimeError: Connection closed by peer")
    rec.phase_exit("train", error="ValueError: bad batch")
    rec.step(6)
    rec.heartbeat()
    i3 = rec.issue(
        F.K_COLL, F.OP_IDS["broadcast"], rec.intern("0"), 1, 4, rec.intern("4"), F.DTYPE_IDS["float64"], 1, 0
    )
    hb = F.LIVE_DONE.unpack_from(rec.mm, F.LIVE_DONE_OFF)[3]
    rec.mark_exit(4)
    rec.mm.flush()
    t1 = time.time_ns()

    ring = R.read_ring(rec.path)
    assert ring.path == rec.path
    assert os.path.basename(rec.path) == "ring-%s-%d.htr" % (socket.gethostname(), os.getpid())
    h = ring.header
    assert (h["version"], h["nslots"], h["strtab_off"], h["strtab_size"]) == (
        1,
        64,
        4096 + 64 * 128,
        F.DEFAULT_STRTAB_SIZE,
    )
    assert (h["pid"], h["ppid"], h["host"], h["run_id"]) == (
        os.getpid(),
        os.getppid(),
        socket.gethostname(),
        "run-xyz",
    )
    assert h["proc_start_ticks"] == proc_start_ticks()
    assert t0 - 10**9 < h["start_wall_ns"] <= t1 and 0 < h["start_mono_ns"] <= time.monotonic_ns()
    assert (h["rank"], h["local_rank"], h["world_size"], h["dump_signal"]) == (3, 1, 8, 12)
    assert (h["phase"], h["phase_depth"], h["step"]) == (None, 0, 6)
    assert (h["state"], h["exit_code"]) == (F.ST_EXITED, 4) and t0 <= h["exit_wall_ns"] <= t1
    assert (h["next_idx"], h["inflight_idx"]) == (i3, i3)
    assert h["progress_count"] == hb and hb >= 6  # creation, completion, phase in/out, step, heartbeat
    assert t0 <= h["progress_wall_ns"] <= t1
    assert h["strtab_used"] == rec.strtab_used and ring.warnings == []

    assert ring.meta == {"actor_class": "Trainer", "actor_id": "abc", "actor_name": "trainer_3"}
    assert ring.groups == [
        {
            "op": "new_group",
            "name": "7",
            "desc": "tp",
            "backend": "gloo",
            "ranks": [2, 3],
            "order": 1,
            "member": True,
        }
    ]
    (ev,) = ring.events
    assert ev["event"] == "start" and ev["argv"] == ["x.py", "--y"] and ev["thread"] == "MainThread"
    assert t0 <= ev["wall_ns"] <= t1

    kinds = [r["kind"] for r in ring.records]
    assert kinds == ["event", "group", "phase_enter", "collective", "p2p", "phase_exit", "step", "collective"]
    assert [r["idx"] for r in ring.records] == list(range(1, 9))
    e, g, pe, c, p, px, st, b = ring.records
    assert e["group"] == "start" and e["a"][0] > 0 and e["state"] == "completed"
    assert g["op"] == "new_group" and g["group"] == "7"
    assert pe["phase"] == "train" and pe["step"] == 5
    assert {
        k: c[k]
        for k in (
            "op",
            "group",
            "seq",
            "numel",
            "shape",
            "dtype",
            "peer",
            "async_op",
            "batch",
            "thread",
            "phase",
            "step",
            "state",
            "error",
        )
    } == dict(
        op="all_gather",
        group="7",
        seq=42,
        numel=12,
        shape="3x4",
        dtype="bfloat16",
        peer=-1,
        async_op=True,
        batch=False,
        thread="MainThread",
        phase="train",
        step=5,
        state="completed",
        error=None,
    )
    assert t0 <= c["t_wall_ns"] <= t1 and c["t_mono_ns"] <= c["t_end_mono_ns"]
    assert {
        k: p[k]
        for k in ("op", "group", "seq", "numel", "dtype", "peer", "async_op", "batch", "state", "error")
    } == dict(
        op="irecv",
        group="0",
        seq=9,
        numel=6,
        dtype="int64",
        peer=2,
        async_op=True,
        batch=True,
        state="failed",
        error="RuntimeError: Connection closed by peer",
    )
    assert p["t_end_mono_ns"] >= p["t_mono_ns"]
    assert px["state"] == "failed" and px["error"] == "ValueError: bad batch" and px["phase"] == "train"
    assert st["seq"] == 6 and st["step"] == 6 and st["phase"] is None
    assert b["op"] == "broadcast" and b["peer"] == 1 and b["state"] == "issued" and b["t_end_mono_ns"] is None
    assert b["dtype"] == "float64" and b["shape"] == "4" and not b["async_op"]


def test_nested_phases_and_threads(rec):
    import threading

    rec.phase_enter("outer")
    rec.phase_enter("inner", step=2)
    assert R.read_ring(rec.path).header["phase_depth"] == 2
    out = []

    def other():
        out.append(coll(rec, 1))

    t = threading.Thread(target=other, name="side-thread")
    t.start()
    t.join()
    i = coll(rec, 2)
    rec.phase_exit("inner")
    ring = R.read_ring(rec.path)
    recs = {r["idx"]: r for r in ring.records}
    assert recs[out[0]]["thread"] == "side-thread"
    assert recs[i]["phase"] == "inner" and recs[i]["thread"] == "MainThread"
    assert (ring.header["phase"], ring.header["phase_depth"], ring.header["step"]) == ("outer", 1, 2)


def test_ring_wraps_and_keeps_the_last_nslots_in_order(rec):
    for i in range(1000):
        idx = coll(rec, i + 1, numel=i)
        rec.complete(idx)
    ring = R.read_ring(rec.path)
    assert [r["idx"] for r in ring.records] == list(range(937, 1001))
    assert [r["seq"] for r in ring.records] == list(range(937, 1001))
    assert [r["numel"] for r in ring.records] == list(range(936, 1000))
    assert all(r["state"] == "completed" for r in ring.records)


@pytest.mark.parametrize("err", [None, "RuntimeError: late"])
def test_late_completion_of_an_overwritten_record(rec, err):
    old = coll(rec, 1)
    newer = [coll(rec, s) for s in range(2, 66)]  # 64 newer records: idx 65 reuses old's slot
    assert (newer[-1] - 1) % 64 == (old - 1) % 64
    rec.complete(old, err=err)
    ring = R.read_ring(rec.path)
    assert [r["idx"] for r in ring.records] == list(range(2, 66))
    last = ring.records[-1]
    assert (last["idx"], last["seq"], last["state"], last["error"], last["t_end_mono_ns"]) == (
        65,
        65,
        "issued",
        None,
        None,
    )
    # the record just inside the window is still completed in place
    rec.complete(newer[0], err=err)
    first = R.read_ring(rec.path).records[0]
    assert first["idx"] == 2 and first["state"] == ("completed" if err is None else "failed")


# --- unreadable files ------------------------------------------------------------------
def good_ring(tmp_path, records=3):
    r = Recorder(str(tmp_path), "run-ok", 64, Log())
    r.set_rank(0, 0, 2)
    for s in range(records):
        r.complete(coll(r, s + 1))
    r.close()
    return r.path


def bad_path(tmp_path):
    return os.path.join(str(tmp_path), "ring-otherhost-4242.htr")


def make_bad(kind, dest, scratch):
    """Write a bad ring file of ``kind`` into ``dest``; return (path, expected error class)."""
    scratch.mkdir(exist_ok=True)
    src = open(good_ring(scratch), "rb").read()
    path = bad_path(dest)
    if kind == "truncated_header":
        data, cls = src[:1000], E.TruncatedRingError
    elif kind == "empty":
        data, cls = b"", E.TruncatedRingError
    elif kind == "truncated_slots":
        data, cls = src[: F.HEADER_SIZE + 10 * F.SLOT_SIZE], E.TruncatedRingError
    elif kind == "random":
        data, cls = os.urandom(20000), E.ForeignFileError
    elif kind == "text":
        data, cls = b"just some notes, not a ring\n" * 300, E.ForeignFileError
    elif kind == "short_text":
        data, cls = b"hi\n", E.ForeignFileError
    elif kind == "other_version":
        b = bytearray(src)
        b[0:8] = b"HTRING02"
        F.U64.pack_into(b, 8, 0)
        b[8:12] = (2).to_bytes(4, "little")
        data, cls = bytes(b), E.UnsupportedVersionError
    elif kind == "version_field":
        b = bytearray(src)
        b[8:12] = (7).to_bytes(4, "little")
        data, cls = bytes(b), E.UnsupportedVersionError
    elif kind == "inconsistent":
        b = bytearray(src)
        b[20:24] = (0).to_bytes(4, "little")  # nslots = 0
        data, cls = bytes(b), E.CorruptRingError
    else:
        raise ValueError(kind)
    with open(path, "wb") as f:
        f.write(data)
    return path, cls


BAD_KINDS = [
    "truncated_header",
    "empty",
    "truncated_slots",
    "random",
    "text",
    "short_text",
    "other_version",
    "version_field",
    "inconsistent",
]


@pytest.mark.parametrize("kind", BAD_KINDS)
def test_bad_file_raises_the_right_error(tmp_path, kind):
    path, cls = make_bad(kind, tmp_path, tmp_path / "src")
    with pytest.raises(E.RingFormatError) as ei:
        R.read_ring(path)
    assert type(ei.value) is cls, (kind, ei.value)
    assert ei.value.path == path and path in str(ei.value)
    assert ei.value.remedy


@pytest.mark.parametrize("kind", BAD_KINDS)
def test_records_lists_good_process_and_one_error_line(tmp_path, kind, capsys):
    run = tmp_path / "run"
    run.mkdir()
    good = good_ring(run)
    bad, cls = make_bad(kind, run, tmp_path / "src")
    snap = load_run(str(run))
    assert [p.ring_path for p in snap.processes] == [good]
    assert len(snap.errors) == 1 and bad in snap.errors[0]

    assert cli.main(["records", str(run)]) == 0
    out = capsys.readouterr().out
    errs = [l for l in out.splitlines() if l.startswith("error:")]
    assert len(errs) == 1 and bad in errs[0], out
    assert "rank 0  %s:%d" % (socket.gethostname(), os.getpid()) in out
    assert "collective all_reduce group=g seq=3" in out

    assert cli.main(["records", str(run), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [p["pid"] for p in d["processes"]] == [os.getpid()]
    assert len(d["errors"]) == 1 and bad in d["errors"][0]


@pytest.mark.parametrize("how", ["huge_length", "small_length", "bad_tag"])
def test_corrupt_string_table_warns_and_keeps_records(tmp_path, how, capsys):
    r = Recorder(str(tmp_path), "run-ok", 64, Log())
    idx = coll(r, 1, group="first-group")
    r.complete(idx)
    r.intern("second-string")
    r.event("start", argv=["a"])
    r.close()
    b = bytearray(open(r.path, "rb").read())
    entry = F.layout(64)[0] + 8  # first entry of the string table: "first-group"
    if how == "huge_length":
        F.STR_ENTRY.pack_into(b, entry, F.T_STR, 1 << 30)
    elif how == "small_length":
        F.STR_ENTRY.pack_into(b, entry, F.T_STR, 3)  # the next "entry" starts inside this text
    else:
        F.STR_ENTRY.pack_into(b, entry, 99, len("first-group"))
    with open(r.path, "wb") as f:
        f.write(b)
    ring = R.read_ring(r.path)
    assert len(ring.warnings) == 1 and "string table corrupt" in ring.warnings[0]
    assert [x["seq"] for x in ring.records if x["kind"] == "collective"] == [1]
    assert ring.records[0]["state"] == "completed"
    assert ring.header["pid"] == os.getpid()

    assert cli.main(["records", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    errs = [l for l in out.splitlines() if l.startswith("error:")]
    assert len(errs) == 1 and r.path in errs[0] and "string table corrupt" in errs[0]
    assert "collective all_reduce" in out


def test_snapshot_cut_after_used_strings_reads(tmp_path):
    path = good_ring(tmp_path)
    dst = str(tmp_path / "copy.htr")
    n = R.compact_copy(path, dst)
    assert n == os.path.getsize(dst) < os.path.getsize(path)
    a, b = R.read_ring(path), R.read_ring(dst)
    assert a.records == b.records and a.strings == b.strings and b.warnings == []
