"""A ring not yet wrapped is read up to its first hole (issue 40): the summary is the one of
the whole slot array; a ring with data after a hole, or wrapped, is read whole. Real rings
written by the Recorder (both paths where built)."""

import os

from hangtrace.hooks.record import recorder as R
from hangtrace.tracer.ring import layout as F
from hangtrace.tracer.ring import reader as RD

NSLOTS = 4096  # 512 KiB of slots: 128 pages, most never written


def _ring(tmp_path, n):
    os.makedirs(tmp_path, exist_ok=True)
    rec = R.Recorder(str(tmp_path), "holes", NSLOTS, lambda *a, **k: None)
    rec.set_rank(0, 0, 2)
    g, s = rec.intern("0"), rec.intern("4")
    for i in range(n):
        idx = rec.issue(F.K_COLL, F.OP_IDS["all_reduce"], g, i + 1, 4, s, F.DTYPE_IDS["float32"], -1, 0)
        rec.complete(idx)
        if i % 7 == 0:
            rec.step(i)
    path = [os.path.join(tmp_path, f) for f in os.listdir(tmp_path) if f.endswith(".htr")][0]
    return path


def _whole(path):
    """The summary with every slot byte read (no hole seeking)."""
    with open(path, "rb") as f:
        hdr = RD.read_header(f.read(F.HEADER_SIZE), path)
        slots = f.read(hdr["nslots"] * F.SLOT_SIZE)
    ring = RD.read_ring(path, records=False)
    from hangtrace.tracer.ring.slotsummary import summarize_slots

    return ring, summarize_slots(slots, hdr["nslots"], ring.strings, hdr["inflight_idx"])


def _fd_len(path):
    with open(path, "rb") as f:
        hdr = RD.read_header(f.read(F.HEADER_SIZE), path)
        return RD._written_len(f.fileno(), hdr["nslots"] * F.SLOT_SIZE), hdr["nslots"] * F.SLOT_SIZE


def test_unwrapped_ring_read_to_its_first_hole_gives_the_same_summary(tmp_path):
    path = _ring(tmp_path, 300)
    got, full = _fd_len(path)
    if got == full:  # the file system reports no holes: nothing to check beyond equality
        assert os.lseek(os.open(path, os.O_RDONLY), F.HEADER_SIZE, os.SEEK_HOLE) >= F.HEADER_SIZE + full
    else:
        assert 340 * F.SLOT_SIZE <= got < full  # 300 collectives + 43 steps, page-rounded
    ring, whole = _whole(path)
    assert ring.summary == whole
    assert ring.summary.count == 343
    assert len(RD.read_ring(path, records=True).records) == 343


def test_data_after_a_hole_or_a_wrapped_ring_is_read_whole(tmp_path):
    path = _ring(tmp_path / "a", 50)
    _, full = _fd_len(path)
    with open(path, "r+b") as f:  # a slot written far past the hole (a page of its own)
        f.seek(F.HEADER_SIZE + (NSLOTS - 1) * F.SLOT_SIZE)
        f.write(b"\x01")
    assert _fd_len(path) == (full, full)
    wrapped = _ring(tmp_path / "b", NSLOTS + 10)
    assert _fd_len(wrapped)[0] == _fd_len(wrapped)[1]
    ring, whole = _whole(wrapped)
    assert ring.summary == whole and ring.summary.count == NSLOTS


def test_a_large_read_ahead_does_not_misplace_the_slots(tmp_path, monkeypatch):
    """A file system with a large block size gives buffered files a read-ahead past the
    header; the hole query moves the descriptor's offset under it. The ring must read the same."""
    path = _ring(tmp_path, 300)
    want = RD.read_ring(path, records=False).summary
    real_open = open

    def big_block_open(file, mode="r", buffering=-1, *a, **k):
        return real_open(file, mode, 65536 if buffering == -1 else buffering, *a, **k)

    monkeypatch.setattr(RD, "open", big_block_open, raising=False)
    assert RD.read_ring(path, records=False).summary == want
