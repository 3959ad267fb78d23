"""Watcher: a traced process busy on CPU outside collectives (importing torch in a Ray
actor's first method, a lazy import in the first optimizer step) holds a short stall
threshold off: as long as that lasts while no rank waits in a collective (a start), up to
the start-up threshold while one does (a straggler); once it waits, the stall is reported
at once. Real processes, real /proc CPU times, the real clock."""

import os
import subprocess
import sys
import time

from hangtrace.hooks.record.recorder import Recorder
from hangtrace.tracer.ring import layout as F
from hangtrace.tracer.watch.busy import STARTUP_BUSY_MAX, BusyClock, cpu_demand_s
from hangtrace.tracer.watch.detector import Watcher

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from jobs import base_env, wait_until  # noqa: E402

# In a phase (a Ray actor's method has one): spin on the CPU until GO exists, then wait.
ACTOR = """
import os, sys, time
from hangtrace import tracer
go = sys.argv[1]
with tracer.phase("setup"):
    print("spinning", flush=True)
    while not os.path.exists(go):
        sum(i * i for i in range(20000))
    print("waiting", flush=True)
    time.sleep(120)
"""


def _header(pid, rank=-1, source=F.RANK_FROM_ENV, count=5, phase=3, inflight=0):
    import socket

    return {
        "pid": pid,
        "host": socket.gethostname(),
        "rank": rank,
        "rank_source": source,
        "progress_count": count,
        "phase_strid": phase,
        "state": F.ST_RUNNING,
        "inflight_idx": inflight,
    }


def test_busy_clock_tells_a_spinning_process_from_a_sleeping_one_also_when_cores_are_short():
    """Twice as many spinners as cores: each gets half a core or less, yet wants a whole
    one (its run-queue wait counts)."""
    spinners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2 * (os.cpu_count() or 1))
    ]
    spin = spinners[0]
    sleep = subprocess.Popen(
        [sys.executable, "-c", "import time; print('go', flush=True); time.sleep(60)"], stdout=subprocess.PIPE
    )
    try:
        assert sleep.stdout.readline() == b"go\n"  # past its start-up (1+ s on a loaded machine)
        clock = BusyClock()
        heads = {"spin%d" % i: _header(s.pid) for i, s in enumerate(spinners)}
        heads["sleep"] = _header(sleep.pid)
        assert clock.busy(heads) == []  # a first sight has nothing to compare
        time.sleep(1.5)
        assert clock.busy(heads) == sorted(s.pid for s in spinners)
        # what may not hold the grace, although it spins
        for why in (
            dict(inflight=7),  # a collective in flight (NCCL spins)
            dict(count=1, phase=0),  # a pooled worker that never worked
            dict(rank=0, source=F.RANK_FROM_ENV),
        ):  # a helper of rank 0, which joined
            c = BusyClock()
            h = {"spin": _header(spin.pid, **why), "r0": _header(sleep.pid, rank=0, source=F.RANK_FROM_GROUP)}
            c.busy(h)
            time.sleep(1.1)
            assert c.busy(h) == [], why
    finally:
        for p in spinners + [sleep]:
            p.kill()
            p.wait()
    assert cpu_demand_s(spin.pid) is None  # gone


def test_a_busy_actor_holds_a_short_stall_off_and_its_wait_is_reported_at_once(tmp_path):
    go = tmp_path / "go"
    rec = None
    p = subprocess.Popen(
        [sys.executable, "-c", ACTOR, str(go)],
        env=base_env(tmp_path / "run"),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout.readline().strip() == "spinning"
        w = Watcher(str(tmp_path / "run"), stall_s=1.0, phase_stall={})
        w.startup_stall_s = 60.0
        t0 = time.monotonic()
        while time.monotonic() - t0 < 4.0:  # 4 s without progress, but busy
            assert w.poll() is None, "a busy process was reported stalled"
            time.sleep(0.2)
        assert w.busy == [p.pid] and w.threshold() == float("inf")  # a start: nobody waits for it
        # a rank of this process waits in a collective: the busy one is a straggler, 60 s
        rec = Recorder(str(tmp_path / "run"), "t", 256, lambda *a, **k: None)
        rec.set_rank(0, 0, 2)
        rec.step(1)  # past its start-up
        rec.issue(1, 1, rec.intern("0"), 1, 1, 0, 1, -1, 0)
        assert w.poll() is None and w.threshold() == 60.0
        log = (tmp_path / "run").glob("watcher-*.log")
        go.touch()
        assert p.stdout.readline().strip() == "waiting"
        inc = wait_until(lambda: w.poll(), timeout=10, period=0.2)
        assert inc.kind == "stall" and w.busy == [] and w.threshold() == 1.0
        text = "".join(f.read_text() for f in log)
        assert "busy on CPU outside collectives" in text and str(p.pid) in text
    finally:
        p.kill()
        p.wait()
        if rec is not None:
            rec.close()


def test_a_process_past_its_exit_record_counts_while_it_finalizes_and_not_once_idle():
    """The header says exited, the pid lives: the interpreter is finalizing (torch's teardown
    took 5+ s at load 30). Busy while it burns CPU; idle past its exit (a destructor that
    never returns) it holds nothing."""
    spin = subprocess.Popen(
        [sys.executable, "-c", "print('go', flush=True)\nwhile True: pass"], stdout=subprocess.PIPE
    )
    idle = subprocess.Popen(
        [sys.executable, "-c", "import time; print('go', flush=True); time.sleep(60)"], stdout=subprocess.PIPE
    )
    try:
        assert (
            spin.stdout.readline() == idle.stdout.readline() == b"go\n"
        )  # (started: on a loaded machine, 1+ s)
        clock = BusyClock()
        heads = {
            "spin": dict(_header(spin.pid, rank=0, source=F.RANK_FROM_GROUP), state=F.ST_EXITED),
            "idle": dict(_header(idle.pid, rank=1, source=F.RANK_FROM_GROUP), state=F.ST_EXITED),
        }
        assert clock.busy(heads) == []
        time.sleep(1.5)
        assert clock.busy(heads) == [spin.pid]
    finally:
        for p in (spin, idle):
            p.kill()
            p.wait()


def test_demand_growth_ignores_a_thread_that_ended_between_two_readings():
    """A sum over the live threads falls when one ends (a rank's exit: gloo's threads end
    while the interpreter finalizes): per thread, the survivors' growth is what counts."""
    from hangtrace.tracer.watch.busy import demand_growth

    before = {"10": 5.0, "11": 20.0, "12": 3.0}
    now = {"10": 5.9, "13": 0.2}  # 11 and 12 ended, 13 started
    assert abs(demand_growth(before, now) - 1.1) < 1e-9
    assert demand_growth(before, now) > 0 > sum(now.values()) - sum(before.values())
    assert demand_growth(2.0, 3.5) == 1.5  # totals (an injected clock of tests)


def test_at_the_start_a_peer_busy_importing_holds_the_grace_whatever_its_length_and_an_idle_one_does_not(
    monkeypatch,
):
    """Issue 37, Lightning at load 12-20: ``python job.py`` (rank 0 and the launcher) imports
    for 60+ s with no rank and no record, then waits in init_process_group while the rank 1
    it spawned imports for 60+ s. Neither has worked yet (``never_worked``), yet both are the
    start going on: no stall while one is busy, however long; once the peer sits idle (it
    sleeps instead of reaching init_process_group) the stall comes after the start-up
    threshold, counted from its last busy poll. After the start a pooled worker that never
    worked holds nothing, as before. Headers constructed, CPU demand and clocks injected; the
    pids are real sleeping children (the watcher checks they live)."""
    import socket

    kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"]) for _ in range(2)]
    try:
        launcher, child = (k.pid for k in kids)
        clk = [1000.0]
        demand = {launcher: 0.0, child: 0.0}
        w = Watcher("/nonexistent-run", stall_s=15, phase_stall={}, clock=lambda: clk[0])
        w.startup_stall_s = 60
        w.busy_clock = BusyClock(cpu=lambda pid: demand.get(pid), wall=lambda: clk[0])
        w.log = w.say = lambda line: None
        host = socket.gethostname()

        def head(pid, rank=-1, source=F.RANK_FROM_ENV, count=1):
            return dict(
                _header(pid, rank=rank, source=source, count=count, phase=0),
                host=host,
                ppid=1,
                proc_start_ticks=0,
                step=0,
                phase=None,
                next_idx=count,
            )

        heads = {"l": head(launcher)}
        monkeypatch.setattr(w, "_read_headers", lambda: dict(heads))

        def run(seconds, busy_pids):
            for _ in range(int(seconds / 5)):
                clk[0] += 5
                for pid in busy_pids:
                    demand[pid] += 4.0  # 0.8 s of CPU demand per wall second: importing
                inc = w.poll()
                if inc is not None:
                    return inc
            return None

        assert run(120, [launcher]) is None  # the launcher imports for 2 minutes: no stall
        heads["l"] = head(launcher, rank=0, source=F.RANK_FROM_JOIN)  # in init_process_group
        heads["c"] = head(child)  # rank 1, spawned by it, importing
        assert run(120, [child]) is None and w.threshold() == float("inf")
        # rank 1 now sleeps instead of reaching init_process_group: idle, recording nothing
        assert run(55, []) is None
        inc = run(15, [])
        assert inc is not None and inc.kind == "stall" and "threshold 60.0 s" in inc.detail, (
            inc and inc.detail
        )
        # past the start (a rank joined a group), a busy process that never worked holds nothing
        w2 = Watcher("/nonexistent-run", stall_s=15, phase_stall={}, clock=lambda: clk[0])
        w2.startup_stall_s = 60
        w2.busy_clock = BusyClock(cpu=lambda pid: demand.get(pid), wall=lambda: clk[0])
        heads.clear()
        heads.update(l=head(launcher, rank=0, source=F.RANK_FROM_GROUP, count=50), c=head(child))
        monkeypatch.setattr(w2, "_read_headers", lambda: dict(heads))
        w = w2
        inc = run(20, [child])
        assert inc is not None and inc.kind == "stall" and "threshold 15.0 s" in inc.detail, (
            inc and inc.detail
        )
        # a peer that spins for ever before init_process_group while rank 0 waits in the
        # rendezvous: the start's grace ends STARTUP_BUSY_MAX start-up thresholds after the start
        w3 = Watcher("/nonexistent-run", stall_s=15, phase_stall={}, clock=lambda: clk[0])
        w3.startup_stall_s = 20
        w3.busy_clock = BusyClock(cpu=lambda pid: demand.get(pid), wall=lambda: clk[0])
        w3.log = w3.say = lambda line: None
        heads.clear()
        heads.update(l=head(launcher, rank=0, source=F.RANK_FROM_JOIN), c=head(child))
        monkeypatch.setattr(w3, "_read_headers", lambda: dict(heads))
        w = w3
        cap = STARTUP_BUSY_MAX * 20
        assert run(cap, [child]) is None  # still the start
        inc = run(30, [child])
        assert inc is not None and inc.kind == "stall" and "threshold 20.0 s" in inc.detail, (
            inc and inc.detail
        )
    finally:
        for k in kids:
            k.kill()
            k.wait()
