"""Watcher: stall only when nothing progresses anywhere; per-phase thresholds; deaths at once."""

import os
import signal
import subprocess
import sys

import pytest

from hangtrace.hooks.record.recorder import Recorder
from hangtrace.tracer import config
from hangtrace.tracer.watch.detector import Watcher
from hangtrace.tracer.watch.helpergrace import HELPER_GRACE_S

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from jobs import base_env  # noqa: E402


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


@pytest.fixture
def rec(tmp_path):
    r = Recorder(str(tmp_path), "t", 256, lambda *a, **k: None)
    r.set_rank(0, 0, 1)
    r.step(1)  # past start-up
    yield r
    r.close()


def test_stall_reported_once_after_threshold(tmp_path, rec):
    clk = Clock()
    w = Watcher(str(tmp_path), stall_s=10, phase_stall={}, clock=clk)
    assert w.poll() is None  # first sight counts as progress
    clk.t += 9.9
    assert w.poll() is None
    clk.t += 0.2
    inc = w.poll()
    assert inc is not None and inc.kind == "stall" and "10.1 s" in inc.detail
    clk.t += 30
    assert w.poll() is None  # reported once per stall
    rec.heartbeat()  # progress resets the clock
    clk.t += 1
    assert w.poll() is None
    clk.t += 10.5
    assert w.poll().kind == "stall"


def test_slow_but_progressing_never_stalls(tmp_path, rec):
    clk = Clock()
    w = Watcher(str(tmp_path), stall_s=10, phase_stall={}, clock=clk)
    for i in range(30):  # 240 s of a job whose sequence numbers advance every 8 s
        clk.t += 8
        idx = rec.issue(1, 1, rec.intern("0"), i + 1, 1, 0, 1, -1, 0)
        rec.complete(idx)
        assert w.poll() is None


def test_per_phase_threshold(tmp_path, rec):
    clk = Clock()
    w = Watcher(str(tmp_path), stall_s=10, phase_stall={"checkpoint": 100}, clock=clk)
    rec.phase_enter("checkpoint", step=3)
    assert w.poll() is None
    clk.t += 50
    assert w.poll() is None  # a checkpoint may take long
    assert w.threshold() == 100
    clk.t += 51
    assert w.poll().kind == "stall"
    rec.phase_exit("checkpoint")
    clk.t += 1
    assert w.poll() is None
    assert w.threshold() == 10


def test_startup_grace(tmp_path, monkeypatch):
    monkeypatch.setenv(config.STARTUP_STALL_S, "60")
    r = Recorder(str(tmp_path), "t", 256, lambda *a, **k: None)
    r.set_rank(0, 0, 2)  # a rank still importing torch / in rendezvous
    clk = Clock()
    w = Watcher(str(tmp_path), stall_s=10, phase_stall={}, clock=clk)
    w.poll()
    clk.t += 30
    assert w.poll() is None
    clk.t += 31
    assert w.poll().kind == "stall"
    r.close()


@pytest.mark.parametrize(
    "how,expect",
    [("kill", "vanished without a clean-exit record"), ("exit3", "exited with code 3"), ("exit0", None)],
)
def test_death_detected_at_next_poll(tmp_path, how, expect):
    code = {
        "kill": "import time; print('ready', flush=True); time.sleep(60)",
        "exit3": "import sys; sys.exit(3)",
        "exit0": "pass",
    }[how]
    p = subprocess.Popen(
        [sys.executable, "-c", code], env=base_env(tmp_path, RANK=1), stdout=subprocess.PIPE, text=True
    )
    try:
        clk = Clock()
        w = Watcher(str(tmp_path), stall_s=1000, phase_stall={}, clock=clk)
        if how == "kill":
            assert p.stdout.readline().strip() == "ready"
            assert w.poll() is None
            p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
        inc = w.poll()
        if expect is None:
            assert inc is None
        else:
            # RANK=1 in its environment, never joined a group: a hint, not "rank 1"
            assert inc.kind == "death" and expect in inc.detail and "a process with RANK=1" in inc.detail
            assert w.poll() is None  # reported once
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()


@pytest.mark.parametrize("how", ["kill", "exit143"])
def test_deaths_after_stall_are_not_a_new_incident(tmp_path, how):
    """Stopping a hung job (user's SIGTERM, launcher's SIGKILL, --stop-on-stall) keeps the
    stall verdict: the deaths are logged, no second incident."""
    code = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))\n"
        "from hangtrace.hooks.process import lifecycle\n"
        "print('ready', flush=True); time.sleep(60)\n"
    )
    p = subprocess.Popen(
        [sys.executable, "-c", code], env=base_env(tmp_path, RANK=1), stdout=subprocess.PIPE, text=True
    )
    try:
        assert p.stdout.readline().strip() == "ready"
        clk = Clock()
        logged = []
        w = Watcher(str(tmp_path), stall_s=10, phase_stall={}, clock=clk)
        w.log = logged.append
        assert w.poll() is None
        clk.t += 60  # past the start-up grace too
        w.startup_stall_s = 10
        inc = w.poll()
        assert inc is not None and inc.kind == "stall"
        p.send_signal(signal.SIGKILL if how == "kill" else signal.SIGTERM)
        p.wait(timeout=30)
        clk.t += 1
        assert w.poll() is None
        assert any("stopped after the stall" in line and "RANK=1" in line for line in logged)
        assert w.poll() is None
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()


def test_death_after_progress_since_stall_is_reported(tmp_path, rec):
    p = subprocess.Popen(
        [sys.executable, "-c", "import sys; print('ready', flush=True); sys.stdin.read(); sys.exit(3)"],
        env=base_env(tmp_path, RANK=1),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout.readline().strip() == "ready"
        clk = Clock()
        w = Watcher(str(tmp_path), stall_s=10, phase_stall={}, clock=clk)
        w.startup_stall_s = 10
        assert w.poll() is None
        clk.t += 11
        assert w.poll().kind == "stall"
        rec.heartbeat()  # the job moved on after the stall
        clk.t += 1
        assert w.poll() is None
        p.stdin.close()
        p.wait(timeout=30)
        assert w.poll() is None  # a child of rank 0 (this process): held for its rank (helpergrace.py)
        clk.t += HELPER_GRACE_S
        inc = w.poll()
        assert inc is not None and inc.kind == "death" and "exited with code 3" in inc.detail
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()


def test_helpers_never_hold_the_startup_grace_and_a_launcher_alone_is_starting():
    """Issue 9: a DataLoader worker (RANK inherited, never joined a group, no progress)
    must not stretch --stall-s to the start-up grace once its rank has joined; a run with
    only a launcher that has not progressed yet (torchrun importing torch) is starting."""
    from hangtrace.tracer.ring import layout as F
    from hangtrace.tracer.watch.detector import Watcher

    def hdr(rank, source, count=5, phase=0):
        return {
            "rank": rank,
            "rank_source": source,
            "progress_count": count,
            "phase_strid": phase,
            "state": F.ST_RUNNING,
            "phase": None,
        }

    w = Watcher("/nonexistent", stall_s=10, phase_stall={})
    w.startup_stall_s = 60
    w.headers = {"r0": hdr(0, F.RANK_FROM_GROUP), "worker": hdr(0, F.RANK_FROM_ENV, count=1)}
    assert w.threshold() == 10
    w.headers = {"r0": hdr(0, F.RANK_FROM_ENV, count=1)}  # rank 0 not joined yet
    assert w.threshold() == 60
    w.headers = {"agent": hdr(-1, F.RANK_FROM_ENV, count=1)}  # only the launcher
    assert w.threshold() == 60
    w.headers = {"actor": hdr(-1, F.RANK_FROM_ENV, count=9, phase=3)}  # rank-less Ray actors
    assert w.threshold() == 10


def test_the_end_of_a_run_gets_the_startup_threshold_once_every_rank_recorded_its_exit():
    """Seen at load 130 on 2 cores: a 3-rank DDP job's ranks all exited 0, torchrun's agent
    took 17 s to notice, and a 5 s threshold called it a stall. Once every rank has recorded
    its exit, what lives on is the job's end (launchers reaping, interpreters finalizing)."""
    from hangtrace.tracer.ring import layout as F
    from hangtrace.tracer.watch.detector import Watcher

    def hdr(rank, source, state=F.ST_RUNNING):
        return {
            "rank": rank,
            "rank_source": source,
            "progress_count": 9,
            "phase_strid": 0,
            "state": state,
            "phase": None,
        }

    w = Watcher("/nonexistent", stall_s=5, phase_stall={})
    w.startup_stall_s = 60
    agent = hdr(-1, F.RANK_FROM_ENV)
    w.headers = {
        "agent": agent,
        "r0": hdr(0, F.RANK_FROM_GROUP, F.ST_EXITED),
        "r1": hdr(1, F.RANK_FROM_GROUP),
    }
    assert w.threshold() == 5  # rank 1 still runs: a hang of rank 1 is reported on time
    w.headers["r1"] = hdr(1, F.RANK_FROM_GROUP, F.ST_EXITED)
    assert w.threshold() == 60
    w.headers = {"agent": agent}  # no rank ever: not an end (the start-up rules decide)
    assert w.threshold() == 5


def test_a_second_process_joining_a_working_ranks_rank_holds_no_startup_grace(monkeypatch):
    """Blind helper 66: rank 0's eval subprocess inherited RANK=0 and joined the job's group
    as rank 0; while the job's rank 0 (alive, progressed) waits for it, --stall-s applies."""
    from hangtrace.tracer.ring import layout as F
    from hangtrace.tracer.watch import detector as W

    def hdr(rank, count):
        return {
            "rank": rank,
            "rank_source": F.RANK_FROM_GROUP,
            "progress_count": count,
            "phase_strid": 0,
            "state": F.ST_RUNNING,
            "phase": None,
        }

    w = W.Watcher("/nonexistent", stall_s=10, phase_stall={})
    w.startup_stall_s = 60
    w.headers = {"r0": hdr(0, 40), "r1": hdr(1, 40), "child": hdr(0, 1)}
    monkeypatch.setattr(W, "live_state", lambda h: "alive")
    assert w.threshold() == 10
    monkeypatch.setattr(W, "live_state", lambda h: "killed")  # a restart: the old rank 0 is gone
    assert w.threshold() == 60


def test_a_gone_process_ring_is_final_and_not_read_again(tmp_path):
    """Issue 13: the ring of a process that exited (or was killed) and is gone never
    changes; the watcher keeps its header and stops opening the file every poll."""
    p = subprocess.run([sys.executable, "-c", "import sys; sys.exit(3)"], env=base_env(tmp_path, RANK=1))
    assert p.returncode == 3
    clk = Clock()
    w = Watcher(str(tmp_path), stall_s=1000, phase_stall={}, clock=clk)
    inc = w.poll()
    assert inc.kind == "death" and "exited with code 3" in inc.detail
    (path,) = w.final
    with open(path, "r+b") as f:  # were it read again, this file would be foreign now
        f.write(b"garbage!")
    assert w.poll() is None  # reported once
    assert path in w.headers and w.headers[path]["exit_code"] == 3
    assert not w.any_alive()


def test_fr_counters_asked_only_of_ranks_whose_ring_did_not_move(tmp_path, rec, monkeypatch):
    """Issue 13: torch's counters (one request per rank and poll) are asked only of a rank
    whose own ring shows no progress in this poll; a moving ring is progress already."""
    from hangtrace.hooks.torchdist.fr_agent import fr_dir
    from hangtrace.tracer.collect import frrequest

    os.makedirs(fr_dir(str(tmp_path)))
    asked = []
    counters = ["0:5:5"]

    def fake(run_dir, pids, timeout_s=0.5):
        asked.append(list(pids))
        return {pid: counters[0] for pid in pids}

    monkeypatch.setattr(frrequest, "fr_progress", fake)
    clk = Clock()
    w = Watcher(str(tmp_path), stall_s=10, phase_stall={}, clock=clk)
    w.poll()  # first sight: the ring "moved"
    assert asked == []
    rec.heartbeat()
    clk.t += 1
    w.poll()
    assert asked == []  # its ring moved again
    clk.t += 1
    w.poll()
    assert asked == [[os.getpid()]]  # ring still: counters asked (baseline)
    for _ in range(8):  # C++-only collectives keep it progressing
        clk.t += 2
        counters[0] = "0:%d:%d" % (clk.t, clk.t)
        assert w.poll() is None
    clk.t += 10.5  # and when they stop, the stall is seen
    assert w.poll().kind == "stall"


def test_a_hang_is_dated_from_the_rings_last_move_and_an_enqueue_is_no_progress(tmp_path, rec, monkeypatch):
    """torch's counters given before the ring last moved are no baseline (they made the
    stall one poll late: the bench_verdict_latency job read threshold + 2 s); and the
    collective a hung rank waits in is enqueued, never completed: no progress."""
    from hangtrace.hooks.torchdist.fr_agent import fr_dir
    from hangtrace.tracer.collect import frrequest

    os.makedirs(fr_dir(str(tmp_path)))
    counters = ["0:5:5"]
    monkeypatch.setattr(
        frrequest, "fr_progress", lambda run_dir, pids, timeout_s=0.5: {p: counters[0] for p in pids}
    )
    clk = Clock()
    w = Watcher(str(tmp_path), stall_s=10, phase_stall={}, clock=clk)
    w.poll()
    clk.t += 1
    w.poll()  # ring still: baseline 0:5:5
    counters[0] = "0:9:9"  # C++ collectives, then a Python step
    rec.heartbeat()
    clk.t += 1
    w.poll()  # the ring moved: progress at t=2
    counters[0] = "0:10:9"  # the collective it hangs in: enqueued only
    clk.t += 1
    assert w.poll() is None  # t=3: new baseline, no progress
    clk.t += 1
    assert w.poll() is None  # t=4: enqueued moved, completed did not
    assert w.last_progress == 1002
    clk.t += 8
    assert w.poll().kind == "stall"  # t=12: 10 s after the ring's last move


def test_idle_pooled_workers_neither_progress_nor_die(tmp_path, rec):
    """Ray starts and retires idle workers every few seconds: processes with no rank hint,
    no phase and no progress. Their rings appearing must not hold a stall off, and their
    being killed is not an incident; a rank-less process that did work is still watched."""
    clk = Clock()
    w = Watcher(str(tmp_path), stall_s=10, phase_stall={}, clock=clk)
    assert w.poll() is None
    code = "import time; print('ready', flush=True); time.sleep(60)"
    for i in range(4):  # a new idle worker every 4 s, the old one killed
        p = subprocess.Popen(
            [sys.executable, "-c", code], env=base_env(tmp_path), stdout=subprocess.PIPE, text=True
        )
        try:
            assert p.stdout.readline().strip() == "ready"
            clk.t += 4
            inc = w.poll()
            assert inc is None or inc.kind == "stall", inc.detail
            p.send_signal(signal.SIGKILL)
            p.wait(timeout=30)
        finally:
            if p.poll() is None:
                p.kill()
            p.wait()
        inc = w.poll()
        assert inc is None or inc.kind == "stall", inc.detail  # the idle worker's death: no incident
    assert w.reported_stall  # 16 s with only idle workers coming and going: the stall was seen
    # a rank-less process that crashes (a fatal-signal dump) before any work is a death (named
    # as a helper of rank 0: its parent, this process, holds the ring of rank 0)
    # (a new watcher: this one reported the stall, after which deaths are the job's stop)
    w = Watcher(str(tmp_path), stall_s=10, phase_stall={}, clock=clk)
    assert w.poll() is None
    crash = "import ctypes; print('ready', flush=True); ctypes.string_at(0)"
    p = subprocess.Popen(
        [sys.executable, "-c", crash], env=base_env(tmp_path), stdout=subprocess.PIPE, text=True
    )
    assert p.stdout.readline().strip() == "ready"
    p.wait(timeout=30)
    assert w.poll() is None  # held for its rank (helpergrace.py) ...
    clk.t += HELPER_GRACE_S
    inc = w.poll()  # ... which did not notice it
    assert inc is not None and inc.kind == "death" and "a helper of rank 0 (its child" in inc.detail, (
        inc and inc.detail
    )
    # a rank-less process that worked (a phase) and is killed is a death
    rec.heartbeat()  # (progress: the stall is over)
    worker = (
        "import time, hangtrace.tracer.api as api; api.phase('score').__enter__(); "
        "print('ready', flush=True); time.sleep(60)"
    )
    p = subprocess.Popen(
        [sys.executable, "-c", worker], env=base_env(tmp_path), stdout=subprocess.PIPE, text=True
    )
    try:
        assert p.stdout.readline().strip() == "ready"
        clk.t += 1
        w.poll()
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
        assert w.poll() is None
        clk.t += HELPER_GRACE_S
        inc = w.poll()
        assert inc is not None and inc.kind == "death" and "a helper of rank 0 (its child" in inc.detail, (
            inc and inc.detail
        )
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()


def test_torchs_counters_say_a_rank_waits_in_a_collective_its_ring_never_saw():
    """Blind helper 65: the peers of a spinning rank waited in DDP's gradient all-reduce (C++,
    not in their rings); the watcher held the stall off for ever ("no rank waits in a
    collective") while the spinning rank was busy on the CPU."""
    from hangtrace.tracer.ring import layout as F
    from hangtrace.tracer.watch.detector import Watcher
    from hangtrace.tracer.watch.frprogress import in_flight

    assert in_flight("0:86:85") and in_flight("1:3:3;0:86:85")
    assert not in_flight("0:85:85") and not in_flight("") and not in_flight("0:None:None")
    w = Watcher("/nonexistent", stall_s=10, phase_stall={})
    w.startup_stall_s = 60
    w.headers = {
        "r0": {
            "rank": 0,
            "rank_source": F.RANK_FROM_GROUP,
            "progress_count": 50,
            "phase_strid": 0,
            "state": F.ST_RUNNING,
            "phase": None,
            "inflight_idx": 0,
        }
    }
    w.busy = [4242]  # another rank spins outside collectives
    assert w.threshold() == float("inf")  # nobody waits, as far as the rings say
    w.fr_seen = {"r0": "0:86:85"}  # torch: one all-reduce enqueued, not completed
    assert w.threshold() == 60  # a straggler: the stall comes after the grace


def test_a_helpers_death_waits_for_its_rank_and_is_reported_with_the_ranks_death():
    """A DataLoader worker killed: its rank notices within torch's 5 s status check and
    raises. The worker's death is held (helpergrace.py) and reported with the rank's, in one
    incident, not alone seconds before it (a verdict taken then finds the rank polling)."""
    from hangtrace.tracer.ring import layout as F
    from hangtrace.tracer.watch.helpergrace import HelperGrace

    rank = {
        "host": "h",
        "pid": 10,
        "ppid": 1,
        "rank": 0,
        "rank_source": F.RANK_FROM_GROUP,
        "state": F.ST_RUNNING,
    }
    worker = {
        "host": "h",
        "pid": 11,
        "ppid": 10,
        "rank": 0,
        "rank_source": F.RANK_FROM_ENV,
        "state": F.ST_RUNNING,
    }
    other = {
        "host": "h",
        "pid": 12,
        "ppid": 1,
        "rank": -1,
        "rank_source": F.RANK_FROM_ENV,
        "state": F.ST_RUNNING,
    }
    headers = {"r": rank, "w": worker, "o": other}
    g = HelperGrace()
    alive = {10: "alive"}
    import hangtrace.tracer.watch.helpergrace as hg

    orig = hg.live_state
    hg.live_state = lambda h: alive.get(h["pid"], "killed")
    try:
        assert g.deaths([("w", worker, "killed")], headers, 100.0) == []  # held
        assert g.deaths([], headers, 100.0 + HELPER_GRACE_S - 0.5) == []  # still held
        alive[10] = "killed"  # the rank dies
        got = g.deaths([("r", rank, "killed")], headers, 103.0)
        assert [p for p, _h, _st in got] == ["w", "r"]  # together
        assert g.deaths([], headers, 200.0) == []
        alive[10] = "alive"
        assert g.deaths([("w", worker, "killed")], headers, 300.0) == []
        assert [p for p, _h, _st in g.deaths([], headers, 300.0 + HELPER_GRACE_S)] == ["w"]  # grace over
        assert [p for p, _h, _st in g.deaths([("o", other, "killed")], headers, 400.0)] == [
            "o"
        ]  # not a helper
    finally:
        hg.live_state = orig
