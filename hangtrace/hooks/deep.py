"""Deep trace (issue 11): viztracer's function-level trace in selected ranks and phases.

Off by default and never imported unless ``HANGTRACE_DEEP`` is set (``bootstrap``
checks the variable first): merely constructing a ``VizTracer`` installs a profile hook
(4.8x slowdown measured, DESIGN.md), so one is constructed only in a selected rank, at
the first entry into a selected phase (or at activation when no phase is named).

``HANGTRACE_DEEP="rank=1,phase=train"`` (``config.deep_selection``): in rank 1, tracing
runs inside ``phase("train")`` only (paused outside it), into viztracer's bounded ring
buffer (``HANGTRACE_DEEP_ENTRIES`` entries, oldest dropped). The buffer is written to
``RUN_DIR/deep/deep-<host>-<pid>.json`` with a clock file ``….clock.json`` (one instant
on viztracer's clock and on CLOCK_MONOTONIC, so the timeline places the events on the
host's aligned clock):

* at a stall: a watchdog thread sees no progress of this process (no collective
  completed, no phase or step change) for half the stall threshold while tracing;
* at exit (``atexit``), and at SIGTERM when Python gets to run its handler (a thread
  blocked inside a C collective does not: the stall dump covers that case).

Never raises into the program: every failure is one line in the run log.
"""

import atexit
import os
import threading
import time
from typing import Any, Callable, FrozenSet, Optional

from hangtrace.tracer import config
from hangtrace.tracer.ring import layout as F

_deep: Optional["DeepTracer"] = None


class DeepTracer:
    """Phase-scoped viztracer for one process. ``rec``: the Recorder; ``log(msg, key)``."""

    def __init__(
        self,
        rec: Any,
        run_dir: str,
        ranks: FrozenSet[int],
        phases: FrozenSet[str],
        entries: int,
        stall_s: float,
        log: Callable[..., None],
    ) -> None:
        self.rec, self.run_dir, self.ranks, self.phases = rec, run_dir, ranks, phases
        self.entries, self.log = entries, log
        self.stall_s = max(0.5, stall_s / 2.0)
        self.viz: Any = None
        self.depth = 0
        self.events = 0
        self.lock = threading.RLock()
        self.dumped_at_stall = False
        self.watchdog: Optional[threading.Thread] = None

    def rank(self) -> int:
        """This process's global rank: the ring header's (set when it joins a group), else RANK."""
        try:
            r = F.RANK.unpack_from(self.rec.mm, F.RANK_OFF)[0]
            if r >= 0:
                return r
        except Exception:
            pass
        try:
            return int(os.environ.get("RANK", "-1"))
        except ValueError:
            return -1

    def selected(self) -> bool:
        return not self.ranks or self.rank() in self.ranks

    def _start(self) -> None:
        if self.viz is None:
            from viztracer import VizTracer

            self.viz = VizTracer(
                tracer_entries=self.entries,
                verbose=0,
                register_global=False,
                process_name="rank %d" % self.rank(),
            )
            self.log(
                "deep trace on: rank %d, phases %s, %d entries"
                % (self.rank(), ",".join(sorted(self.phases)) or "all", self.entries),
                "deep-on",
            )
            self._start_watchdog()
        else:
            # frames entered before the last pause (the phase exit that paused it) are still
            # on viztracer's stack: drop them, or they show up as callers of the next phase
            self.viz.reset_stack()
        self.viz.start()

    def phase_enter(self, name: str) -> None:
        """Start (or resume) tracing when ``name`` is a selected phase of a selected rank."""
        try:
            if self.phases and name not in self.phases:
                return
            with self.lock:
                if self.depth == 0 and self.selected():
                    self._start()
                    self.depth = 1
                elif self.depth:
                    self.depth += 1
        except Exception as e:
            self.log("deep trace start failed: %r" % (e,), "deep-start")

    def phase_exit(self, name: str) -> None:
        """Pause tracing when the outermost selected phase is left."""
        try:
            if self.phases and name not in self.phases:
                return
            with self.lock:
                if self.depth:
                    self.depth -= 1
                    if self.depth == 0 and self.viz is not None:
                        self.viz.stop()
        except Exception as e:
            self.log("deep trace stop failed: %r" % (e,), "deep-stop")

    def dump(self, reason: str) -> Optional[str]:
        """Write the buffer and its clock file into ``RUN_DIR/deep``; returns the path."""
        import json

        with self.lock:
            if self.viz is None:
                return None
            try:
                d = os.path.join(self.run_dir, "deep")
                os.makedirs(d, mode=0o700, exist_ok=True)
                base = os.path.join(d, "deep-%s-%d" % (self.rec.host, self.rec.pid))
                viz_us, mono_ns, wall_ns = self.viz.getts(), time.monotonic_ns(), time.time_ns()
                self.viz.save(base + ".json")  # stops the tracer (viztracer parses its buffer)
                self.depth = 0
                with open(base + ".clock.json", "w") as f:
                    json.dump(
                        {
                            "host": self.rec.host,
                            "pid": self.rec.pid,
                            "rank": self.rank(),
                            "viz_us": viz_us,
                            "mono_ns": mono_ns,
                            "wall_ns": wall_ns,
                            "reason": reason,
                            "entries": self.entries,
                        },
                        f,
                    )
                self.log("deep trace written (%s): %s.json" % (reason, base), "deep-dump-" + reason)
                return base + ".json"
            except Exception as e:
                self.log("deep trace dump failed: %r" % (e,), "deep-dump")
                return None

    def _start_watchdog(self) -> None:
        t = threading.Thread(target=self._watch, name="hangtrace-deep", daemon=True)
        self.watchdog = t
        t.start()

    def _watch(self) -> None:
        last, since = None, time.monotonic()
        while not self.dumped_at_stall:
            time.sleep(min(0.25, self.stall_s / 4))
            try:
                cur = self.rec._progress
            except Exception:
                return
            now = time.monotonic()
            if cur != last:
                last, since = cur, now
            elif self.depth and now - since >= self.stall_s:
                self.dumped_at_stall = True
                self.dump("stall")


def install(rt: Any) -> Optional[DeepTracer]:
    """Set up deep tracing for this process when ``HANGTRACE_DEEP`` selects anything.
    Returns the DeepTracer (also registered with ``tracer.api``) or None. Never raises."""
    global _deep
    try:
        sel = config.deep_selection()
        if sel is None:
            return None
        ranks, phases = sel
        dt = DeepTracer(
            rt.recorder,
            rt.run_dir,
            ranks,
            phases,
            config.get_int(config.DEEP_ENTRIES),
            config.get_float(config.STALL_S),
            rt.log,
        )
        _deep = dt
        from hangtrace.tracer import api

        api._set_deep(dt)
        atexit.register(_at_exit)
        if not phases and dt.selected():
            dt.phase_enter("")
        return dt
    except Exception as e:
        try:
            rt.log("deep trace not installed: %r" % (e,), "deep-install")
        except Exception:
            pass
        return None


def _at_exit() -> None:
    dt = _deep
    if dt is not None and dt.viz is not None and not dt.dumped_at_stall:
        dt.dump("exit")


# --- the instrumentor (hooks/instrument.py contract) -------------------------------------
from hangtrace.hooks.instrument import Instrumentor  # noqa: E402


class DeepInstrumentor(Instrumentor):
    """Issue 11: the opt-in deep trace. ``bootstrap`` imports this module only when
    ``HANGTRACE_DEEP`` is set (constructing a VizTracer installs a profile hook)."""

    name = "deep"

    def _install(self, runtime: Any) -> None:
        install(runtime)
