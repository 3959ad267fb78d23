"""The memory sampler of a traced process (issue 5): host, cgroup, CUDA, gauges -> ring.
In: the recorder, the run log, the interval; out: K_MEM records (``Sampler.sample``), from
the phase/step API, its timer thread and the OOM hooks. This process's one sampler is
started, stopped and handed to forked children by ``memory.py``.

What one sample writes (record layout in ``tracer/ring/layout.py``, kind K_MEM):

* ``host``: RSS (``/proc/PID/statm`` field 2 x page size), swap (``VmSwap`` of
  ``/proc/PID/status``), and the process's memory cgroup: usage, limit (the smallest limit
  of the cgroup and its ancestors; 0 = none) and the ``oom_kill`` counter. cgroup v1:
  ``memory.usage_in_bytes``, ``memory.limit_in_bytes``, ``memory.oom_control``
  (``oom_kill N``, kernel >= 4.13); v2: ``memory.current``, ``memory.max``,
  ``memory.events`` (``oom_kill N``). The cgroup directory comes from
  ``/proc/PID/cgroup`` mapped through ``/proc/PID/mountinfo`` (works inside a cgroup
  namespace).
* ``cuda:N`` (only when torch is imported AND ``torch.cuda.is_initialized()``; CUDA is
  never initialised here): ``memory_allocated``, ``memory_reserved``,
  ``max_memory_allocated``, and ``mem_get_info`` free/total.
* ``gauge:<name>`` for every ``tracer.gauge(name, fn)``.

When: just after a phase is entered, just before it is left, at every ``tracer.step``
and on a timer (``HANGTRACE_MEM_INTERVAL_S``, default 1 s; the tick writes no record when
a phase/step sample is younger than the interval; its thread starts once the process is
past its start, ``hooks/mem/memclock.py``). The host figures are three ``pread``s of open
descriptors, in C with the C recorder (``Ring.mem_host``); ``/proc/PID/status`` costs
~120 us: swap, limits and ``mem_get_info`` are refreshed on the timer thread only.

CUDA out of memory: the allocator's out-of-memory observer (``hooks/mem/memcuda.py``) is
attached the first time the timer sees CUDA initialised; an ``OutOfMemoryError``/
``MemoryError`` leaving a ``tracer.phase`` or reaching ``sys.excepthook`` writes a MEM_OOM
sample too. A forked child takes its parent's sampler over (``hooks/mem/memfork.py``).

Nothing here raises into the program: every entry point swallows its errors and logs
each kind once to the run log. Standard library only (torch is looked up in
``sys.modules``, never imported: ``torchcuda.py``).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from hangtrace.hooks.mem.cgroup import CgroupFiles, parse_limit
from hangtrace.hooks.mem.torchcuda import torch_cuda
from hangtrace.tracer import api
from hangtrace.tracer.ring import layout as F

_mono = time.monotonic_ns


def _is_oom_type(etype: Any) -> bool:
    return isinstance(etype, type) and (
        issubclass(etype, MemoryError) or etype.__name__ == "OutOfMemoryError"
    )


class Sampler(CgroupFiles):
    """Samples memory into ``recorder``'s ring. ``log(msg, key)`` logs once per key.

    CUDA figures and the allocator's OOM observer: ``hooks/mem/memcuda.py``, imported only
    once torch has initialised CUDA (not at start-up)."""

    def __init__(
        self, recorder: Any, log: Callable[..., None], interval_s: float = 1.0, run_dir: Optional[str] = None
    ) -> None:
        self.rec = recorder
        self.log = log
        self.run_dir = run_dir
        self.interval_s = max(0.05, float(interval_s))
        self.interval_ns = int(self.interval_s * 1e9)
        self.pid = os.getpid()
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.dead = False
        self.last_ns = 0
        self.nsamples = 0
        self._stop = threading.Event()
        self.thread: Optional[threading.Thread] = (
            None  # the timer thread; None until it starts (hooks/mem/memclock.py)
        )
        self._fds: List[int] = []
        self._statm = self._open("/proc/%d/statm" % self.pid)
        self.swap = -1
        self.cg_version = 0
        self.cg_dir: Optional[str] = None
        self._cg_raw: Optional[bytes] = None
        self._usage: Optional[int] = None
        self._oom: Optional[int] = None
        self._limit_fds: List[int] = []
        self.limit = -1
        self.oom_kills = -1
        self._host = recorder.intern("host")
        self._cuda: Dict[int, List[Any]] = {}  # device -> [strid, free, total]
        self._cuda_hooked = False
        self._gauge_sids: Dict[str, int] = {}
        self._oom_seen: Optional[int] = None  # id of the last exception recorded as MEM_OOM
        self._oom_count = 0
        #: called once, on the first timer tick (the process has lived one interval):
        #: the environment record waits for it (``hooks/env/envrecord.py``)
        self.on_first_tick: List[Callable[[], None]] = []
        self._check_cgroup()
        self._refresh_slow()

    def _refresh_slow(self) -> None:
        """Swap, limit, CUDA free/total: the expensive figures (timer thread only)."""
        try:
            with open("/proc/%d/status" % self.pid, "rb") as f:
                for line in f:
                    if line.startswith(b"VmSwap:"):
                        self.swap = int(line.split()[1]) * 1024
                        break
        except (OSError, ValueError, IndexError):
            self.swap = -1
        lim = 0
        seen = False
        for fd in self._limit_fds:
            try:
                v = parse_limit(os.pread(fd, 64, 0))
            except (OSError, ValueError):
                continue
            seen = True
            if v and (not lim or v < lim):
                lim = v
        self.limit = lim if seen else -1
        self._cuda_slow()

    # -- sampling -----------------------------------------------------------------------
    def sample(self, source: int) -> None:
        """Write one sample of every source (host, CUDA devices, gauges). Never raises."""
        if self.dead:
            return
        try:
            rec = self.rec
            mh = getattr(getattr(rec, "_fast", None), "mem_host", None)  # the C Ring's: the same, in one call
            if mh is not None:
                mh(source, *self._host_args())
            else:
                self._sample_host(rec, source)
            if self._cuda:
                _memcuda().sample_cuda(self, source)
            if api._gauges:
                self._sample_gauges(source)
            self.last_ns = _mono()
            self.nsamples += 1
            if self.thread is None and source != F.MEM_TIMER:  # (the phase/step API: started)
                _memclock().kick(self)
        except Exception as e:
            self.log("memory: sampling failed: %r" % (e,), "mem-sample")

    def _host_args(self) -> Tuple[int, ...]:
        """``Ring.mem_host``'s figures after the source: host strid, statm fd, page size,
        usage fd, oom fd, swap and limit bytes (-1: none)."""
        return (
            self._host,
            -1 if self._statm is None else self._statm,
            self.page,
            -1 if self._usage is None else self._usage,
            -1 if self._oom is None else self._oom,
            self.swap,
            self.limit,
        )

    def last_sample_ns(self) -> int:  # monotonic ns of the newest sample (0: none), the API's C path's too
        return max(self.last_ns, getattr(getattr(self.rec, "__dict__", {}).get("_fast"), "mem_last_ns", 0))

    def fast_args(self, ring: Any) -> Optional[Tuple[int, ...]]:
        """``_host_args()`` for the phase/step API's one-call path (``api._bind``), or None
        when a sample needs this Python path (sampler stopped or not yet on its timer thread,
        CUDA, gauges, ``ring`` not this recorder's). The tick unbinds when these change."""
        if (
            self.dead
            or self.thread is None
            or self._stop.is_set()
            or self._cuda
            or api._gauges
            or getattr(self.rec, "__dict__", {}).get("_fast") is not ring
        ):
            return None
        return self._host_args()

    def _sample_gauges(self, source: int) -> None:
        for name, (fn, limit) in list(api._gauges.items()):
            try:
                got = fn()
                if isinstance(got, (tuple, list)):
                    v, lim = int(got[0]), int(got[1] or 0)
                else:
                    v, lim = int(got), int(limit or 0)
            except Exception as e:
                self.log("memory: gauge %r raised %r; its samples are skipped" % (name, e), "mem-g-" + name)
                continue
            sid = self._gauge_sids.get(name)
            if sid is None:
                sid = self._gauge_sids[name] = self.rec.intern("gauge:" + name)
            self.rec.memory(source, sid, v, lim, -1, -1, -1)

    def on_exception(self, etype: Any, evalue: Any) -> None:
        """An exception leaves a phase (or reaches sys.excepthook): an out-of-memory error
        (torch's OutOfMemoryError, MemoryError) gets one MEM_OOM sample, with the phase and
        step where it was raised. Never raises."""
        try:
            if not _is_oom_type(etype) or id(evalue) == self._oom_seen:
                return
            self._oom_seen = id(evalue)
            self._oom_count += 1
            self.sample(F.MEM_OOM)
        except Exception:
            pass

    # -- CUDA (hooks/mem/memcuda.py) --------------------------------------------------------
    def _cuda_slow(self) -> None:
        if torch_cuda() is not None:
            _memcuda().cuda_slow(self)

    def on_cuda_oom(self, device: int, alloc: int, device_allocated: int, device_free: int) -> None:
        """torch's CUDA allocator out-of-memory observer (``memcuda.on_cuda_oom``). Never raises."""
        try:
            _memcuda().on_cuda_oom(self, device, alloc, device_allocated, device_free)
        except Exception:
            pass

    # -- timer thread -------------------------------------------------------------------
    def tick(self) -> None:
        """One timer tick: refresh the slow figures; sample unless a sample is recent;
        on the first, the ``on_first_tick`` callbacks (their errors are swallowed)."""
        cbs = self.on_first_tick
        if cbs:
            self.on_first_tick = []
            for cb in cbs:
                try:
                    cb()
                except Exception:
                    pass
        try:
            if getattr(self.rec, "lazy", False):  # a forked helper's ring still in memory (memfork)
                _memfork().on_tick(self)
            self._check_cgroup()
            self._refresh_slow()
            bound = api._fast
            if bound is not None and api._mem != self.fast_args(bound):  # (new fds, swap, limit, CUDA)
                api._unbind()
        except Exception as e:
            self.log("memory: refresh failed: %r" % (e,), "mem-refresh")
        if _mono() - self.last_sample_ns() >= self.interval_ns * 0.9:
            self.sample(F.MEM_TIMER)

    def _run(self) -> None:
        wait = max(0.0, (self.last_sample_ns() + self.interval_ns - _mono()) / 1e9)  # (0: started late)
        while not self._stop.wait(wait):
            if self.dead:
                return
            self.tick()
            wait = self.interval_s

    def start(self, defer: bool = False) -> None:
        """The first sample now; the timer thread now, or with ``defer`` once the process
        is past its start (``hooks/mem/memclock.py``)."""
        self.sample(F.MEM_TIMER)
        if not (defer and _memclock().defer_thread(self)):
            _memclock().start_thread(self)

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop the timer thread and wait for it (at exit: no thread of ours may be inside
        a torch call when the interpreter finalizes, see torch_completion._Poller)."""
        self._stop.set()
        api._unbind()
        t = getattr(self, "thread", None)
        if t is not None and t is not threading.current_thread():
            t.join(timeout_s)

    def abandon(self) -> None:
        """In a forked child: stop using this (the parent's) sampler without touching the ring."""
        self.dead = True
        api._unbind()
        self._stop.set()
        for fd in self._fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds = []


def _memcuda() -> Any:  # CUDA sampling, imported once CUDA is in use (not at start-up)
    from hangtrace.hooks.mem import memcuda

    return memcuda


def _memclock() -> Any:  # when the bootstrap's timer thread starts (issue 8)
    from hangtrace.hooks.mem import memclock

    return memclock


def _memfork() -> Any:  # for forked children (imported by bootstrap._before_fork, not at start-up)
    from hangtrace.hooks.mem import memfork

    return memfork
