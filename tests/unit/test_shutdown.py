"""A clean shutdown is no death: processes a framework ends without an exit record while the
job's root exits 0 (Ray Train V2 at the end of ``fit()``: its workers, controller,
SynchronizationActor, PreemptionWatcher) give no verdict - in the analysis
(``analyze/failures/shutdown.py``, synthetic snapshots) and in the watcher
(``watch/shutdown.py``, real processes and rings)."""

import os
import signal
import subprocess
import sys

from hangtrace.tracer.analyze.diagnose import diagnose
from hangtrace.tracer.analyze.failures.shutdown import cleaned, ended_quietly
from hangtrace.tracer.diagnosis import Kind
from hangtrace.tracer.snapshot import ProcessInfo
from hangtrace.tracer.watch.detector import Watcher
from hangtrace.tracer.watch.shutdown import SHUTDOWN_GRACE_S
from synth import MS, S, T0, R, snap

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from jobs import base_env  # noqa: E402


def _actor(pid, cls, state="killed", phase=None, start=T0 + S, **kw):
    return ProcessInfo(
        host="h0",
        pid=pid,
        state=state,
        start_wall_ns=start,
        phase=phase,
        progress_wall_ns=start + S,
        meta={"ray_actor_id": "a%d" % pid, "ray_actor_class": cls},
        **kw,
    )


def _raytrain_end(driver_code=0, **worker_kw):
    """A Ray Train run at its end: the driver (root), two ranks and Ray Train's actors, all
    ended by Ray without an exit record; the driver exited ``driver_code``."""
    driver = ProcessInfo(
        host="h0", pid=10, state="exited", exit_code=driver_code, start_wall_ns=T0, exit_wall_ns=T0 + 90 * S
    )
    workers = []
    for r in range(2):
        b = R(r, 2, pid=100 + r, phase=None)
        b.coll(n=20)
        b.set(
            state="killed",
            start_wall_ns=T0 + S,
            meta={"ray_actor_id": "w%d" % r, "ray_actor_class": "RayTrainWorker"},
        )
        b.set(**worker_kw)
        workers.append(b.build())
    actors = [
        _actor(200, "SynchronizationActor"),
        _actor(201, "PreemptionWatcher"),
        _actor(202, "TrainController"),
    ]
    return snap([driver] + workers + actors, reason="offline", taken=T0 + 100 * S)


def test_clean_raytrain_end_is_no_death():
    d = diagnose(_raytrain_end())
    assert d.kind not in (Kind.DEAD_RANK, Kind.STUCK_OUTSIDE_COLLECTIVE), (d.kind, d.summary)
    assert not d.culprit_ranks and not d.culprit_actors, d.summary
    assert any("clean shutdown" in e for e in d.evidence), d.evidence


def test_same_end_after_a_failed_driver_is_a_death():
    """The driver exited 1 (fit() raised): the same quiet ends are deaths, as before."""
    d = diagnose(_raytrain_end(driver_code=1))
    assert d.kind == Kind.DEAD_RANK, (d.kind, d.summary)


def test_a_crash_or_an_exception_is_never_a_clean_shutdown():
    base = _raytrain_end()
    crash = _actor(300, "Worker", signals={"fatal": {"wall_ns": T0 + 5 * S, "text": "Segmentation fault"}})
    raised = _actor(
        301,
        "Worker",
        events=[{"event": "exception", "type": "RuntimeError", "message": "boom", "wall_ns": T0}],
    )
    busy = _actor(302, "Worker", phase="train_step")
    sigterm_exit = _actor(
        303, "Dashboard", state="exited", exit_code=15, signals={"sigterm": {"wall_ns": T0}}
    )
    assert not ended_quietly(crash) and not ended_quietly(raised) and not ended_quietly(busy)
    assert ended_quietly(sigterm_exit)
    s2, lines = cleaned(snap(base.processes + [crash, sigterm_exit], reason="offline", taken=T0 + 100 * S))
    states = {p.pid: (p.state, p.exit_code) for p in s2.processes}
    assert states[300] == ("killed", None) and states[303] == ("exited", 0) and states[200] == ("exited", 0)
    assert len(lines) == 6  # 2 ranks, 3 actors, the SIGTERMed dashboard; never the root nor the crash


def test_rank_killed_inside_a_collective_is_not_cleaned():
    s = _raytrain_end(inflight={"op": "all_reduce", "idx": 5})
    s2, _ = cleaned(s)
    assert {p.pid: p.state for p in s2.processes}[100] == "killed"
    _ = MS


# --- the watcher: a quiet death waits for the root's exit ----------------------------------
ROOT = (
    "import sys, hangtrace.tracer.api as api\n"
    "with api.phase('main'): pass\n"
    "print('ready', flush=True)\n"
    "sys.exit(int(sys.stdin.readline()))\n"
)
WORKER = (
    "import time, hangtrace.tracer.api as api\n"
    "with api.phase('method'): pass\n"  # worked once, now idle between methods (a Ray actor)
    "print('ready', flush=True)\n"
    "time.sleep(120)\n"
)


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def _start(tmp_path, code):
    return subprocess.Popen(
        [sys.executable, "-c", code],
        env=base_env(tmp_path),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _watch_end(tmp_path, root_code):
    """Root then worker; the worker is SIGKILLed while idle, then the root exits
    ``root_code`` (None: stays alive). Returns (incidents after the kill, log lines)."""
    clk = Clock()
    w = Watcher(str(tmp_path), stall_s=60, phase_stall={}, clock=clk)
    lines = []
    w.log = lines.append
    root = _start(tmp_path, ROOT)
    worker = None
    try:
        assert root.stdout.readline().strip() == "ready"
        worker = _start(tmp_path, WORKER)
        assert worker.stdout.readline().strip() == "ready"
        assert w.poll() is None
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=30)
        clk.t += 1
        incs = [w.poll()]
        if root_code is not None:
            root.stdin.write("%d\n" % root_code)
            root.stdin.flush()
            root.wait(timeout=30)
        clk.t += 1
        incs.append(w.poll())
        clk.t += SHUTDOWN_GRACE_S
        incs.append(w.poll())
        return incs, lines
    finally:
        for p in (worker, root):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


def test_watcher_quiet_death_then_clean_root_exit_is_no_incident(tmp_path):
    incs, lines = _watch_end(tmp_path, 0)
    assert incs == [None, None, None], [i and i.detail for i in incs]
    assert any("clean shutdown" in ln for ln in lines), lines


def test_watcher_quiet_death_then_failed_root_is_a_death(tmp_path):
    incs, _ = _watch_end(tmp_path, 1)
    assert incs[0] is None  # held while the root lives
    assert any(i is not None and i.kind == "death" for i in incs[1:]), [i and i.detail for i in incs]


def test_watcher_quiet_death_reported_when_the_root_lives_on(tmp_path):
    incs, _ = _watch_end(tmp_path, None)
    assert incs[0] is None and incs[1] is None
    assert incs[2] is not None and incs[2].kind == "death", incs


def test_a_process_sigtermed_by_someone_outside_is_never_a_quiet_death():
    """A driver that SIGTERMs a trainer, catches its death and exits 0 ended no clean run:
    the SIGTERM's recorded sender is neither Ray's own processes nor hangtrace."""
    from hangtrace.tracer.watch.shutdown import quiet

    h = {"inflight_idx": 0, "phase_strid": 0, "rank": 1}
    by_driver = {"sigterm": {"sender": {"pid": 4242, "uid": 0, "cmdline": "python3 driver.py"}}}
    by_raylet = {"sigterm": {"sender": {"pid": 77, "uid": 0, "cmdline": "/x/ray/core/src/ray/raylet/raylet"}}}
    assert not quiet(h, "exited", lambda _h: by_driver)
    assert not quiet(h, "killed", lambda _h: by_driver)
    assert quiet(h, "exited", lambda _h: by_raylet)  # Ray's own teardown: may be a shutdown
    assert quiet(h, "killed", lambda _h: {})
    # a rank-less helper the driver SIGTERMs itself in ray.shutdown() (Ray's dashboard, log
    # monitor) may be a clean shutdown
    assert quiet(dict(h, rank=-1), "exited", lambda _h: by_driver)
