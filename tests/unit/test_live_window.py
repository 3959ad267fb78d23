"""A live snapshot is judged over a window, not an instant (issue 38): the ring window's
definition of progress (``watch/progress.py``) and its use by the analysis
(``analyze/context.judged_window``)."""

import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from synth import S, T0, ranks, snap  # noqa: E402

from hangtrace.tracer.analyze.diagnose import diagnose  # noqa: E402
from hangtrace.tracer.diagnosis import Kind  # noqa: E402
from hangtrace.tracer.snapshot import ProgressWindow  # noqa: E402
from hangtrace.tracer.watch import progress  # noqa: E402


def caught_apart():
    """Ranks 0-1 in all_reduce seq 6, rank 2 not there yet: one instant of a healthy job
    (or of a hung one)."""
    b = ranks(3, steps=5)
    b[0].wait()
    b[1].wait()
    s = snap(b, reason="request")
    return dataclasses.replace(s, taken_wall_ns=max(p.progress_wall_ns for p in s.processes) + S // 10)


def test_a_point_in_time_snapshot_catching_ranks_apart_gives_a_hang():
    d = diagnose(caught_apart(), stall_s=300)
    assert (d.kind, d.culprit_ranks) == (Kind.STUCK_OUTSIDE_COLLECTIVE, [2])


def test_a_process_that_advanced_in_the_window_makes_it_progressing():
    s = dataclasses.replace(caught_apart(), window=ProgressWindow(window_s=2.0, advanced=("h0:1002",)))
    d = diagnose(s, stall_s=300)
    assert d.kind == Kind.PROGRESSING, d.summary
    assert d.culprit_ranks == []
    assert d.details["window"] == {"window_s": 2.0, "advanced_ranks": [2], "advanced_processes": 1}
    assert any("made progress" in e for e in d.evidence)
    # a helper process (a DataLoader worker) that advanced is progress too
    s = dataclasses.replace(s, window=ProgressWindow(window_s=2.0, advanced=("h0:4242",)))
    assert diagnose(s, stall_s=300).kind == Kind.PROGRESSING


def test_nothing_advanced_in_the_window_lets_the_hang_rules_judge():
    s = dataclasses.replace(caught_apart(), window=ProgressWindow(window_s=2.0, advanced=()))
    d = diagnose(s, stall_s=300)
    assert (d.kind, d.culprit_ranks) == (Kind.STUCK_OUTSIDE_COLLECTIVE, [2]), d.summary
    assert d.details["window"]["advanced_ranks"] == []
    # ranks outside collectives with nothing moving for 2 s: no stall below the threshold
    # (a step of long compute), one above it
    b = ranks(3, steps=5)
    s = dataclasses.replace(snap(b, reason="request", taken=T0 + 10 * S), window=ProgressWindow(2.0))
    assert diagnose(s, stall_s=300).kind == Kind.PROGRESSING
    assert diagnose(s, stall_s=1).kind == Kind.UNKNOWN


def test_the_watcher_s_snapshots_ignore_a_window():
    s = dataclasses.replace(caught_apart(), reason="stall", window=ProgressWindow(2.0, advanced=("h0:1002",)))
    assert diagnose(s, stall_s=300).kind == Kind.STUCK_OUTSIDE_COLLECTIVE


def header(pid, count, rank=0, step=0, phase=0, state=0):
    return {
        "host": "h0",
        "pid": pid,
        "rank": rank,
        "progress_count": count,
        "phase_strid": phase,
        "step": step,
        "state": state,
    }


def test_progress_between_two_readings_is_the_watcher_s_progress():
    before = {"a": header(1, 5), "b": header(2, 7), "c": header(3, 1, rank=-1), "d": header(4, 9)}
    after = {
        "a": header(1, 6),  # a collective completed
        "b": header(2, 7),  # still
        "c": header(3, 1, rank=-1),  # a pooled worker that never worked
        "d": header(4, 9),  # still in the ring, torch's completed counter moved (DDP, C++)
        "e": header(5, 1, rank=-1),  # a new pooled worker: not progress
        "f": header(6, 1, rank=1),  # a new DataLoader worker of rank 1: progress
    }
    fr_before = {"b": "0:10:10", "d": "0:10:10"}
    fr_after = {"b": "0:11:10", "d": "0:11:11"}  # b: enqueued only (the one it waits in)
    assert progress.moved_between(before, after, fr_before, fr_after) == ["h0:1", "h0:4", "h0:6"]


def test_the_window_takes_the_snapshot_between_two_readings(tmp_path, monkeypatch):
    t = [100.0]
    reads = []
    monkeypatch.setattr(progress, "read_headers", lambda run_dir, final=None: reads.append(t[0]) or {})
    monkeypatch.setattr(progress, "ask_counters", lambda run_dir, by_pid, timeout_s=0.5: {})

    def during():
        t[0] += 0.3
        return "snap"

    w, got = progress.window(
        str(tmp_path), 0.2, during=during, clock=lambda: t[0], sleep=lambda s: t.__setitem__(0, t[0] + s)
    )
    assert got == "snap" and reads == [100.0, 101.0]  # at least MIN_WINDOW_S apart
    assert w == ProgressWindow(window_s=1.0, source="rings", advanced=())


def test_a_stored_snapshot_keeps_its_window(tmp_path):
    """``analyze`` of a snapshot folder ``dump`` wrote judges it as ``dump`` did."""
    from hangtrace.tracer.collect import rings

    w = ProgressWindow(window_s=2.1, advanced=("h0:1001", "h0:1002"))
    rings.write_window(dataclasses.replace(caught_apart(), path=str(tmp_path), window=w))
    assert rings._read_window(str(tmp_path)) == w
    assert rings._read_window(str(tmp_path / "none")) is None


def _stuck_beside_heartbeats(work):
    """Rank 0 waits in all_reduce seq 4; rank 1 completed seqs 1-3, then its ring moved only
    by Ray Train's poll_status calls every 2 s for 12 s (``work``: by back-to-back work
    instead, up to the snapshot). The window saw rank 1 move."""
    from synth import MS, R

    b0, b1 = R(0, 2, phase=None), R(1, 2, phase=None)
    for b in (b0, b1):
        b.coll(n=3)
    b0.wait()
    for _ in range(6 if not work else 1200):
        name, gap = ("poll_status", 2 * S) if not work else ("get_batch", 10 * MS)
        b1.mark("phase_enter", phase=name, dt=gap)
        b1.mark("phase_exit", phase=name, dt=MS // 10)
        b1.phase = None
    s = snap([b0, b1], reason="request", taken=b1.t + S // 10)
    return dataclasses.replace(s, window=ProgressWindow(window_s=2.0, advanced=("h0:1001",)))


def test_a_ring_moved_only_by_heartbeats_in_the_window_is_no_progress():
    """Ray Train's controller polls every worker every ~2 s: a window that sees a stuck
    worker's ring move by those calls alone must not call the job progressing (its newest
    work, past the heartbeats, is older than the window)."""
    d = diagnose(_stuck_beside_heartbeats(work=False), stall_s=5)
    assert d.kind != Kind.PROGRESSING, d.summary
    assert d.details["window"]["advanced_ranks"] == []
    # the same move made by work up to the snapshot is progress
    d = diagnose(_stuck_beside_heartbeats(work=True), stall_s=5)
    assert d.kind == Kind.PROGRESSING, d.summary
