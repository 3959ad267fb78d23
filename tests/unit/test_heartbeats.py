"""Heartbeats (``ring/heartbeats.py``): a framework's periodic, quick, empty call - Ray Train's
``poll_status`` every ~2 s - is no progress; work, long calls, irregular or back-to-back calls
are. And the watcher (``watch/beattail.py``): a rank whose ring moves only by such calls stalls."""

import os
import sys
import time

from hangtrace.hooks.record.recorder import Recorder
from hangtrace.tracer.ring.heartbeats import MIN_CALLS, HeartbeatBook
from hangtrace.tracer.watch.detector import Watcher

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

MS = 1_000_000
S = 1_000_000_000


def _calls(book, name, starts, dur=MS // 5, thread="Main", inside=()):
    """Feed calls of ``name`` starting at ``starts`` (ns); ``inside``: kinds recorded
    inside each call. Returns what feed said of each record."""
    out = []
    for t in starts:
        out.append(book.feed("phase_enter", name, thread, t))
        for k in inside:
            out.append(book.feed(k, name, thread, t + 1))
        out.append(book.feed("phase_exit", name, thread, t + dur))
    return out


def test_periodic_quick_empty_call_becomes_a_heartbeat():
    b = HeartbeatBook()
    said = _calls(b, "poll_status", [i * 2 * S for i in range(MIN_CALLS)])
    assert all(said)  # the first calls count: nothing is known yet
    assert b.is_beat("poll_status")
    assert _calls(b, "poll_status", [MIN_CALLS * 2 * S]) == [False, False]
    # memory samples and Ray waits neither spoil nor prove
    assert b.feed("memory", None, "Main", 1) is False and b.feed("ray_wait", None, "T", 1) is False
    # the training thread's collective is progress, and does not spoil the heartbeat
    assert b.feed("collective", None, "TrainingThread", 7 * S) is True
    assert b.is_beat("poll_status")


def test_work_inside_long_or_failed_calls_are_never_heartbeats():
    for kw in ({"inside": ("collective",)}, {"inside": ("phase_enter",)}, {"dur": S}, {"inside": ("step",)}):
        b = HeartbeatBook()
        _calls(b, "m", [i * 2 * S for i in range(6)], **kw)
        assert not b.is_beat("m"), kw
    b = HeartbeatBook()
    _calls(b, "m", [i * 2 * S for i in range(5)])
    b.feed("phase_enter", "m", "Main", 11 * S)
    b.feed("phase_exit", "m", "Main", 11 * S + MS, failed=True)
    assert not b.is_beat("m")  # one failed call: for good


def test_back_to_back_or_irregular_calls_are_work():
    b = HeartbeatBook()
    _calls(b, "get_batch", [i * 10 * MS for i in range(10)])  # a work loop: 10 ms apart
    assert not b.is_beat("get_batch")
    b = HeartbeatBook()
    _calls(b, "push", [0, 1 * S, 9 * S, 10 * S, 30 * S])  # irregular
    assert not b.is_beat("push")


def test_watcher_a_rank_moving_only_by_heartbeats_stalls(tmp_path):
    """A real ring: a rank (joined a group) whose only records are periodic quick empty
    calls stalls after the threshold; a step on it is progress again."""
    clk = [1000.0]
    rec = Recorder(str(tmp_path), "t", 1024, lambda *a, **k: None)
    try:
        rec.set_rank(0, 0, 1)
        rec.step(1)
        w = Watcher(str(tmp_path), stall_s=10, phase_stall={}, clock=lambda: clk[0])
        w.startup_stall_s = 10
        assert w.poll() is None
        incs = []
        for _ in range(MIN_CALLS + 8):
            time.sleep(0.6)  # the period (MIN_PERIOD_NS 0.5 s)
            rec.phase_enter("poll_status")
            rec.phase_exit("poll_status")
            clk[0] += 4
            incs.append(w.poll())
        stalls = [i for i in incs if i is not None and i.kind == "stall"]
        assert stalls, "a rank moving only by heartbeats was never reported"
        rec.step(2)
        clk[0] += 1
        assert w.poll() is None and w.reported_stall is False  # real progress again
    finally:
        rec.close()


def test_analysis_last_progress_skips_heartbeats():
    """A rank whose newest progress records are Ray Train's poll_status calls: its last
    progress (``rankview.progress_wall``) is its last collective, not the newest poll."""
    import dataclasses

    from hangtrace.tracer.analyze.rankview import index_process
    from synth import R

    b = R(1, 2, phase=None)
    last = b.coll(n=3)
    for _ in range(6):
        b.mark("phase_enter", phase="poll_status", dt=2 * S)
        b.mark("phase_exit", phase="poll_status", dt=MS // 10)
        b.phase = None
    p = b.build()
    v = index_process(1, dataclasses.replace(p, progress_wall_ns=b.t))
    assert v.progress_wall == last["t_wall_ns"], (v.progress_wall - last["t_wall_ns"]) / 1e9
    # the same calls 10 ms apart, back to back, are work: the newest one is the progress
    w = R(1, 2, phase=None)
    w.coll(n=3)
    for _ in range(6):
        w.mark("phase_enter", phase="get_batch", dt=10 * MS)
        w.mark("phase_exit", phase="get_batch", dt=MS // 10)
        w.phase = None
    v2 = index_process(1, w.build())
    assert v2.progress_wall == w.t


def test_a_heartbeat_is_no_phase_of_the_rank():
    """Ray Train's poll_status is not the rank's phase in a verdict ("at phase 'poll_status'")."""
    from hangtrace.tracer.analyze.rankview import index_process
    from synth import R

    b = R(1, 2, phase="train")
    b.coll(n=3)
    for _ in range(6):
        b.mark("phase_enter", phase="poll_status", dt=2 * S)
        b.mark("phase_exit", phase="poll_status", dt=MS // 10)
    v = index_process(1, b.build())
    assert v.phase is None, v.phase
