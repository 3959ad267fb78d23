"""A forked child's memory sampler: its parent's, taken over in place (issue 13).

A process forked by a traced one (a DataLoader worker) starts with a copy of its parent's
``Sampler`` object: its settings, its run log, and open descriptors of the parent's memory
cgroup files (usage, oom counter, the limits of it and its ancestors: per cgroup, not per
process; fork(2) puts the child in its parent's cgroup). ``take_over`` re-targets that
copy to the child - its own ring, ``/proc/<child>/statm``, fresh counters, a new stop
event - instead of closing everything and building a new sampler (``Sampler.__init__``:
about a hundred interpreted lines, each a few copy-on-write page faults in a fresh child).
The cgroup descriptors are kept, the parent's last effective limit is kept until the first
tick refreshes it, swap reads -1 (unknown) until then, and the timer thread's
``_check_cgroup`` follows a later move to another cgroup (the ``/proc/PID/cgroup`` text it
compares with is the parent's, which the child's equals at fork). Imported in the
parent by bootstrap's before-fork handler (not at start-up, not in every child), so that
forked children find it loaded. Standard
library only; never raises (False: the caller builds a new sampler).

The child's timer is a ``ChildClock``: one raw thread (``_thread``, no ``threading``
bookkeeping) asleep for one interval, then the sampler's loop. Most DataLoader workers of
short epochs exit before that interval ends, so they take no sample and run none of
``threading``'s Python code, whose every first touch in a fresh child is a copy-on-write
fault (issue 13: with this and ``Runtime.prepare_child``, a bare fork+exit child of a
traced rank costs +1.5 ms of CPU over untraced, against +1.9 to 3.8 ms before; benchmarks/README.md).

``on_tick``: the sampler's timer tick in a forked helper whose ring is still in memory
(``ringsize.Growable.materialize``) writes it to its file first: a helper that has lived a
sampling interval (1 s) is one a stall or a death may concern, and its ring costs it about
a millisecond of CPU per interval at most.
"""

from __future__ import annotations

import _thread
import os
import time
from typing import Any, Optional

from hangtrace.tracer.ring import layout as F


class ChildClock:
    """A forked child's sampler timer (module docstring): ``s.thread`` while it waits.

    Its raw thread sleeps one interval (``time.sleep``: C only), then, unless the
    sampler was stopped meanwhile, writes the cgroup facts to the ring and runs
    ``Sampler._run`` (first tick at once). ``join`` is ``Sampler.stop``'s: it waits only
    for a clock that is sampling; one still waiting samples nothing and needs no join (the
    thread runs no torch call, and dies with the process). Never raises into the child."""

    def __init__(self, s: Any) -> None:
        self.s = s
        self.sampling = False
        self._done = _thread.allocate_lock()
        self._done.acquire()
        self.ident = _thread.start_new_thread(self._main, ())  # (as Thread.ident: its pthread_t)

    def _main(self) -> None:
        try:
            s = self.s
            time.sleep(s.interval_s)
            self.sampling = True  # (before the check: stop() sets _stop, then reads this)
            if s.dead or s._stop.is_set():
                return
            _cgroup_meta(s)
            s._run()
        except Exception:
            pass
        finally:
            self._done.release()

    def join(self, timeout: Optional[float] = None) -> None:
        if self.sampling:
            self._done.acquire(True, -1 if timeout is None else timeout)


class StopFlag:
    """``threading.Event``'s ``is_set``, ``set`` and ``wait`` on one raw lock: a forked
    child's sampler stop flag, made at fork without running ``threading``'s Python code
    (an Event is a Condition over a Lock: several first-run functions in a fresh child)."""

    __slots__ = ("_flag", "_gate")

    def __init__(self) -> None:
        self._flag = False
        self._gate = _thread.allocate_lock()
        self._gate.acquire()  # released by set(): waiters pass

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        if not self._flag:
            self._flag = True
            try:
                self._gate.release()
            except RuntimeError:  # (set twice at once: released already)
                pass

    def wait(self, timeout: Optional[float] = None) -> bool:
        """True when set; waits up to ``timeout`` s (None: for ever) for ``set``."""
        if not self._flag and self._gate.acquire(True, -1 if timeout is None else max(0.0, timeout)):
            self._gate.release()  # (the next waiter passes too)
        return self._flag


def _cgroup_meta(s: Any) -> None:
    """The cgroup facts of the child's samples, into its ring once: when the ring goes to
    its file (``on_grow``: a lazy ring in memory is lost with the process anyway) or at the
    clock's first tick, whichever comes first."""
    if getattr(s, "_meta_due", False):
        s._meta_due = False
        s.rec.set_meta(mem_cgroup=s.cg_dir, mem_cgroup_version=s.cg_version, mem_page_size=s.page)


def _on_file(s: Any) -> None:
    """The child's ring went to its file (it matters now: it recorded an event, joined a
    group, or lived an interval): the cgroup facts, and a first sample unless it has one."""
    _cgroup_meta(s)
    if not s.nsamples:
        s.sample(F.MEM_TIMER)


def take_over(s: Any, rt: Any) -> bool:
    """Make ``s`` (the parent's sampler, as copied into this forked child) sample this
    process into ``rt.recorder``, its timer a ``ChildClock`` (first sample after one
    interval). Returns True when done; False when ``s`` cannot be taken over (it was
    stopped, or a step failed: logged, and ``s`` abandoned)."""
    try:
        if s.dead or s._stop.is_set():
            return False
        rec = rt.recorder
        old_statm = s._statm
        s._fds = [fd for fd in s._fds if fd != old_statm]
        if old_statm is not None:
            os.close(old_statm)  # the parent's /proc/<ppid>/statm
        s.rec, s.log, s.run_dir = rec, rt.log, rt.run_dir
        s.pid = os.getpid()
        s._statm = s._open("/proc/%d/statm" % s.pid)
        s._stop = StopFlag()  # (the parent's Event may be held by its timer thread)
        s.swap, s.last_ns, s.nsamples, s._oom_seen, s._oom_count = -1, 0, 0, None, 0
        s._cuda, s._cuda_hooked, s._gauge_sids = {}, False, {}  # (CUDA is unusable after fork)
        s._host = rec.intern("host")
        s._meta_due = True
        rec.on_grow.append(lambda _rec: _on_file(s))
        s.thread = ChildClock(s)
        return True
    except Exception as e:
        try:
            rt.log("memory sampling in a forked child: %r" % (e,), "mem-fork")
            s.abandon()
        except Exception:
            pass
        return False


def on_tick(s: Any) -> None:
    """Before a timer tick's sample: a lazy ring (a forked helper's) goes to its file."""
    rec = s.rec
    if getattr(rec, "lazy", False):
        rec.materialize("alive for a sampling interval")
