"""The compact ring summary: the numpy index pass and the pure-Python path give the same
result on real rings written by the Recorder (filled, wrapped, with failures, p2p,
memory samples, an in-flight record), and match what a full decode shows."""

import pytest

from hangtrace.hooks.record.recorder import Recorder
from hangtrace.tracer.ring.summary import TAIL
from hangtrace.tracer.ring import layout as F
from hangtrace.tracer.ring import reader as R
from hangtrace.tracer.ring.summary import summarize_records


def _log(msg, key=None):
    pass


def _write(tmp_path, nslots, n, fail_at=None, hang=False):
    """A ring of ``nslots`` slots with ``n`` rounds of: collective on 'g' (seq i), a p2p
    send on 'g' to peer (i % 3), an all_reduce on 'h' every 3rd round, a step record, a
    phase 'train' (failed every 7th round; 'ckpt' failed at round 4), a memory sample
    every 5th round. Returns the ring path."""
    rec = Recorder(str(tmp_path), "run-s", nslots, _log)
    try:
        rec.set_rank(2, 0, 4)
        g, h = rec.intern("g"), rec.intern("h")
        what = rec.intern("host")
        seq_h = 0
        p2p_seq = {}
        for i in range(1, n + 1):
            c = rec.issue(
                F.K_COLL, F.OP_IDS["all_reduce"], g, i, 4, rec.intern("4"), F.DTYPE_IDS["float32"], -1, 0
            )
            rec.complete(c, "Connection closed by peer" if i == fail_at else None)
            peer = i % 3
            p2p_seq[peer] = p2p_seq.get(peer, 0) + 1
            p = rec.issue(F.K_P2P, F.OP_IDS["send"], g, p2p_seq[peer], 2, 0, F.DTYPE_IDS["float32"], peer, 0)
            rec.complete(p)
            if i % 3 == 0:
                seq_h += 1
                x = rec.issue(
                    F.K_COLL, F.OP_IDS["broadcast"], h, seq_h, 1, 0, F.DTYPE_IDS["int64"], 0, F.F_ASYNC
                )
                rec.complete(x)
            rec.step(i)
            rec.phase_enter("train")  # fails every 7th round; 'ckpt' fails once, at round 4
            rec.phase_exit("train", "ValueError: round %d" % i if i % 7 == 0 else None)
            if i == 4:
                rec.phase_enter("ckpt")
                rec.phase_exit("ckpt", "OSError: disk full")
            if i % 5 == 0:
                rec.memory(F.MEM_TIMER, what, 100 * i, 0, 200 * i, 1 << 30, 0)
        if hang:
            rec.issue(F.K_COLL, F.OP_IDS["all_reduce"], g, n + 1, 4, 0, F.DTYPE_IDS["float32"], -1, 0)
        return rec.path
    finally:
        rec.close()


@pytest.mark.parametrize(
    "nslots,n,fail_at,hang",
    [
        (4096, 50, None, True),
        (64, 200, None, True),
        (64, 200, 190, False),
        (128, 37, 3, True),
        (32, 1, None, False),
    ],
)
def test_numpy_and_python_paths_agree(tmp_path, nslots, n, fail_at, hang):
    pytest.importorskip("numpy")
    path = _write(tmp_path, nslots, n, fail_at, hang)
    full = R.read_ring(path)
    fast = R.read_ring(path, records=False, use_numpy=True)
    slow = R.read_ring(path, records=False, use_numpy=False)
    assert fast.records == [] and slow.records == []
    assert fast.summary == slow.summary == full.summary
    s = fast.summary
    recs = full.records
    assert s.count == len(recs) == min(nslots, len(recs))
    assert s.last == recs[-1]
    assert s.tail == tuple(recs[-TAIL:])
    assert list(s.memory) == [r for r in recs if r["kind"] == "memory"]
    colls = [r for r in recs if r["kind"] == "collective"]
    assert set(s.by_group) == {r["group"] for r in colls}
    for grp, r in s.by_group.items():
        assert r["seq"] == max(c["seq"] for c in colls if c["group"] == grp)
    if hang:
        assert s.inflight is not None and s.inflight["seq"] == n + 1 and s.inflight["state"] == "issued"
        assert s.by_group["g"]["seq"] == n + 1
    else:
        assert s.inflight is None
    failed = [r for r in recs if r["kind"] in ("collective", "p2p") and r["state"] == "failed"]
    assert s.first_failed == (failed[0] if failed else None)
    if fail_at and fail_at > n - nslots // 4:
        assert s.first_failed is not None and s.first_failed["error"] == "Connection closed by peer"


def test_compact_records_give_the_same_summary(tmp_path):
    """The records a summary keeps are enough to compute the same summary again (what the
    analysis' one-pass index relies on), except the count and the tail."""
    path = _write(tmp_path, 64, 300, fail_at=290, hang=True)
    s = R.read_ring(path, records=False).summary
    again = summarize_records(s.records(), inflight_idx=s.inflight["idx"])
    for f in (
        "last",
        "last_comm",
        "first_failed",
        "last_progress",
        "inflight",
        "by_group",
        "by_peer",
        "memory",
    ):
        assert getattr(again, f) == getattr(s, f), f


def test_memory_sample_is_its_own_record_type(tmp_path):
    path = _write(tmp_path, 256, 10)
    m = [r for r in R.read_ring(path).records if r["kind"] == "memory"]
    assert len(m) == 2
    assert "op" not in m[0] and "group" not in m[0]
    assert m[0]["source"] == "timer" and m[0]["what"] == "host" and m[0]["a"][0] == 500


def test_empty_ring(tmp_path):
    rec = Recorder(str(tmp_path), "run-e", 16, _log)
    rec.close()
    for np_ in (True, False):
        s = R.read_ring(rec.path, records=False, use_numpy=np_).summary
        assert s.count == 0 and s.last is None and s.records() == []


def test_without_numpy_the_reader_falls_back_to_python(tmp_path, monkeypatch):
    path = _write(tmp_path, 64, 120, fail_at=100, hang=True)
    with_np = R.read_ring(path, records=False).summary
    monkeypatch.setitem(__import__("sys").modules, "numpy", None)  # import numpy -> ImportError
    without = R.read_ring(path, records=False).summary
    assert without == with_np and type(without.tail) is tuple
    with pytest.raises(ImportError):
        R.read_ring(path, records=False, use_numpy=True)


def test_failed_phases_are_the_newest_exit_per_phase_when_it_failed(tmp_path):
    """'train' failed at round 7 and completed after: not listed; at round 14 (the last
    failure, nothing after in 14 rounds) it is; 'ckpt' failed once and never ran again."""
    pytest.importorskip("numpy")
    for n, want in ((9, {"ckpt"}), (14, {"ckpt", "train"})):
        d = tmp_path / str(n)
        d.mkdir()
        path = _write(d, 4096, n)
        fast = R.read_ring(path, records=False, use_numpy=True).summary
        slow = R.read_ring(path, records=False, use_numpy=False).summary
        assert fast.failed_phases == slow.failed_phases
        assert set(fast.failed_phases) == want, fast.failed_phases
        assert fast.failed_phases["ckpt"]["error"] == "OSError: disk full"


class _Handle:
    """Stands for a Ray ActorHandle (what hooks/ray_calls.note_call reads)."""

    class _Id:
        def __init__(self, h):
            self._h = h

        def hex(self):
            return self._h

    class _Desc:
        class_name = "Server"

    def __init__(self, aid):
        self._ray_actor_id = self._Id(aid)
        self._ray_actor_creation_function_descriptor = self._Desc()


class _Ref:
    def __init__(self, b):
        self._b = b

    def binary(self):
        return b"ref-%d" % self._b


def test_waits_newest_per_thread_on_both_paths(tmp_path):
    """Ray wait records (hooks/rayhooks/ray_calls.py): per thread the newest, completed or still
    issued, equal on the numpy and the Python path, kept in records() - also after the
    ring wrapped (64 slots, 150 rounds)."""
    import threading
    from hangtrace.hooks.rayhooks import ray_calls

    pytest.importorskip("numpy")
    rec = Recorder(str(tmp_path), "run-w", 64, _log)
    ray_calls._rec_fn = lambda: rec
    try:
        ray_calls.note_call(_Handle("aa01"), "score", [_Ref(1)])
        ray_calls.note_call(_Handle("bb02"), "policy_version", _Ref(2))
        for i in range(150):
            r, idx = ray_calls._wait_begin("get", [_Ref(1), _Ref(99)])
            ray_calls._wait_end(r, idx, None)
            rec.step(i)
        open_one = []
        t = threading.Thread(
            target=lambda: open_one.append(ray_calls._wait_begin("wait", [_Ref(2)])), name="poller"
        )
        t.start()
        t.join()
        ray_calls._wait_end(*ray_calls._wait_begin("get", _Ref(1)), TimeoutError("x"))
        path = rec.path
    finally:
        ray_calls._rec_fn = None
        ray_calls._refs.clear()
        rec.close()
    fast = R.read_ring(path, records=False, use_numpy=True).summary
    slow = R.read_ring(path, records=False, use_numpy=False).summary
    assert fast.waits == slow.waits
    assert set(fast.waits) == {"MainThread", "poller"}
    main, poller = fast.waits["MainThread"], fast.waits["poller"]
    assert (main["state"], main["error"]) == ("failed", "TimeoutError")
    assert poller["state"] == "issued" and poller["kind"] == "ray_wait"
    import json

    assert json.loads(poller["group"]) == {
        "api": "wait",
        "n": 1,
        "targets": [{"actor_id": "bb02", "class": "Server", "method": "policy_version"}],
    }
    assert poller in fast.records() and main in fast.records()
