"""A quiet death waits a few seconds for the job to end: a clean shutdown is no incident.

Frameworks end their own workers without an exit record when a job ends well. Ray Train V2
(ray 2.60, measured 2026-12-07 on the blind job ``rt_clean``): at the end of ``fit()`` its
controller calls ``shutdown`` on each worker, then Ray's raylet SIGTERMs or SIGKILLs the
worker actors, the ``TrainController``, its ``SynchronizationActor``, ``PreemptionWatcher``
and ``DatasetManager`` (Ray's worker exits without running ``atexit``); ``ray.shutdown()``
in the driver then SIGTERMs Ray's dashboard (exit 15). Every one of them "vanished without a
clean-exit record" about 1.7 s before the driver exited 0: each clean run was a death verdict.

So a *quiet* death - a process killed or SIGTERMed while idle (no phase open: a Ray actor
between two methods; nothing in flight: no collective or p2p issued and not completed) and
without a fatal-signal dump - is held while the run's root process (the process that started first: the driver,
the launcher) is alive, for up to :data:`SHUTDOWN_GRACE_S`. The root exiting 0 in that time
makes them the job's clean shutdown (logged, no incident); the root dying or exiting non-zero,
or the end of the grace with the root still alive, reports them. A death in a collective, a
crash (fatal-signal dump) and the root's own death are reported at once, as before.
"""

from __future__ import annotations

from typing import Callable, List, Mapping, Optional

from hangtrace.tracer.collect.ringprocs import live_state, read_signal_files
from hangtrace.tracer.ring import layout as F
from hangtrace.tracer.watch.headers import Header
from hangtrace.tracer.watch.notes import Death

#: seconds a quiet death waits for the root to exit: the driver exited 1.7 s after Ray Train's
#: first worker died on the 2-core machine, 2.9 s under a load average of 10 (2026-12-07);
#: a margin for heavier load
SHUTDOWN_GRACE_S = 10.0


def root_of(headers: Mapping[str, Header]) -> Optional[Header]:
    """The run's root process: the one whose ring started first (the driver or launcher
    that started the job; its children start after it). None without headers."""
    hs = [h for h in headers.values() if h.get("start_wall_ns")]
    return min(hs, key=lambda h: (h["start_wall_ns"], h["pid"])) if hs else None


def clean_exit(h: Header) -> bool:
    """The process of header ``h`` wrote its exit record with code 0."""
    return h["state"] == F.ST_EXITED and h["exit_code"] == 0


def quiet(h: Header, st: str, signals: Callable[[Header], Mapping[str, object]]) -> bool:
    """A death that may be a shutdown: killed (no exit record) or exited after a SIGTERM,
    idle (no phase open, nothing in flight), no fatal-signal dump (``signals``: the signal
    files of a header), and not a rank SIGTERMed by someone outside the framework
    (``teardown.external_sender``: a user, a driver's ``os.kill``, a scheduler): a driver
    that catches the death of the process it SIGTERMed and exits 0 ended no clean run
    (blind-written Ray job of 2026-12-07, ``test_ray_sigterm_teardown``)."""
    from hangtrace.tracer.analyze.failures.teardown import external_sender

    if h.get("inflight_idx") or h.get("phase_strid"):
        return False
    sig = signals(h)
    if "fatal" in sig:
        return False
    term = sig.get("sigterm")
    if (h.get("rank", -1) or 0) >= 0 and isinstance(term, Mapping) and external_sender(term):
        return False  # (a driver's ray.shutdown() SIGTERMs Ray's rank-less helpers itself: quiet)
    return st == "killed" or (st == "exited" and "sigterm" in sig)


class ShutdownGrace:
    """Holds quiet deaths while the root lives (module docstring). ``held``: the deaths held;
    ``until``: when the grace of the first ends (the watcher's clock, s)."""

    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir
        self.held: List[Death] = []
        self.until = 0.0

    def _signals(self, h: Header) -> Mapping[str, object]:
        try:
            return read_signal_files(self.run_dir, h["host"], h["pid"])
        except Exception:
            return {}

    def deaths(
        self, new: List[Death], headers: Mapping[str, Header], now: float, log: Callable[[str], None]
    ) -> List[Death]:
        """The deaths to report at this poll (held ones included), or [] while they wait
        (``now``: the watcher's clock, s; ``log``: where a clean shutdown is noted)."""
        root = root_of(headers)
        if root is None:
            return self.held + new if (self.held or new) else []
        held_before = bool(self.held)
        root_alive = live_state(root) == "alive"
        if root_alive and new and all(h is not root and quiet(h, st, self._signals) for _p, h, st in new):
            if not self.held:
                self.until = now + SHUTDOWN_GRACE_S
            self.held.extend(new)
            log(
                "pid %s ended quietly while the job's root pid %d lives: held up to %.0f s for a clean "
                "shutdown"
                % (", ".join(str(h["pid"]) for _p, h, _st in new[:12]), root["pid"], SHUTDOWN_GRACE_S)
            )
            return []
        if not root_alive and clean_exit(root):
            loud = [d for d in new if not quiet(d[1], d[2], self._signals)]
            out, self.held = self.held + [d for d in new if d not in loud], []
            if out:
                log(
                    "%d process(es) (pid %s) ended while the job shut down (its root pid %d exited 0): "
                    "a clean shutdown, not an incident"
                    % (len(out), ", ".join(str(h["pid"]) for _p, h, _st in out[:12]), root["pid"])
                )
            return loud
        if new or (held_before and (now >= self.until or not root_alive)):
            out, self.held = self.held + new, []
            if held_before:
                log(
                    "quiet deaths released: %s"
                    % ("a loud one" if new else "the grace ended or the root failed")
                )
            return out
        return []
