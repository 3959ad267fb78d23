"""Which traced processes of this host are busy on CPU outside collectives.

A process that records nothing while it burns CPU outside any collective is working,
not waiting: importing torch (a Ray actor's first method, 70 s on a loaded 2-core
machine here), building a model, a first optimizer step that imports sympy lazily. While
one is busy, the watcher reports no stall as long as no rank waits in a collective (a
start: seen, the node watcher with a 6 s threshold called Ray actors importing torch in
``setup`` "stuck" on a loaded machine, and a blind job's actors took 77 s to import
torch beside two CPU burners); while some rank does wait in one, the busy process is a
straggler and the stall needs ``HANGTRACE_STARTUP_STALL_S``. Either way the grace ends
at the first poll where nothing is busy: a run whose ranks then wait is reported at
once. Not reported, by design: every process spinning outside collectives for ever with
nobody waiting (no distributed wait to explain).

Not counted: a process with a collective in flight (an NCCL rank spins a CPU while it
waits), a pooled worker that never did any work (Ray's idle workers churn on start-up),
a helper of a rank (a DataLoader worker prefetching), and processes of other hosts.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any, Callable, Dict, FrozenSet, List, Mapping, Optional, Tuple

from hangtrace.tracer.ring import layout as F
from hangtrace.tracer.watch.headers import never_worked

#: Seconds of CPU demand (run + run-queue wait) per wall second from which a process is busy.
BUSY_FRACTION = 0.5

_HOST = socket.gethostname()
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def cpu_demand_s(pid: int) -> Optional[float]:
    """Seconds the threads of ``pid`` ran on a CPU or waited on a run queue for one
    (``/proc/PID/task/TID/schedstat`` fields 1 and 2, ns; the kernel's sched-stats.rst),
    summed; or, without schedstat, user + system CPU time (``/proc/PID/stat`` fields 14
    and 15, proc(5)). None when the process is gone or unreadable. Never raises.

    A run-queue wait counts because it is demand: on a loaded machine a process importing
    torch gets a fraction of a core (5 CPU-bound processes on 2 cores: 0.4 each), yet
    wants a whole one; a process that waits on a socket or a lock wants none."""
    try:
        total = 0
        for tid in os.listdir("/proc/%d/task" % pid):
            try:
                with open("/proc/%d/task/%s/schedstat" % (pid, tid), "rb") as f:
                    run_ns, wait_ns = f.read().split()[:2]
                total += int(run_ns) + int(wait_ns)
            except FileNotFoundError:
                continue  # a thread that ended meanwhile
        return total / 1e9
    except (OSError, ValueError):
        pass
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) * _TICK_S
    except (OSError, ValueError, IndexError):
        return None


def counts(h: Mapping[str, Any], joined_ranks: FrozenSet[int]) -> bool:
    """Whether the header's process may hold the grace: alive-looking, of this host, no
    collective in flight, past "never worked" (a rank, a phase or progress), and not a
    helper of a rank (its rank hint from the environment is held by a process that
    joined a group as that rank)."""
    if h.get("host") != _HOST or h["state"] == F.ST_EXITED or h.get("inflight_idx"):
        return False
    if never_worked(h):
        return False
    rank = h.get("rank", -1)
    helper = rank >= 0 and h.get("rank_source", 0) == F.RANK_FROM_ENV and rank in joined_ranks
    return not helper


class BusyClock:
    """CPU time of the watched processes across polls.

    ``busy(headers)`` returns the pids (this host) whose CPU demand (``cpu_demand_s``)
    grew by at least ``BUSY_FRACTION`` of the wall time over the last ``INTERVAL_S`` or more (measured on
    ``wall``, a monotonic clock in seconds: CPU per real second, whatever clock the
    watcher judges stalls by; shorter intervals are noise, as /proc/PID/stat counts
    CPU in 10 ms ticks, and keep the last verdict). ``cpu`` and ``wall`` are injectable for tests."""

    INTERVAL_S = 1.0

    def __init__(
        self, cpu: Callable[[int], Optional[float]] = cpu_demand_s, wall: Callable[[], float] = time.monotonic
    ) -> None:
        self.cpu, self.wall = cpu, wall
        self.ref: Dict[int, Tuple[float, float]] = {}  # pid -> (wall s, demand s) at the last verdict
        self.verdict: Dict[int, bool] = {}

    def busy(self, headers: Mapping[str, Mapping[str, Any]]) -> List[int]:
        joined = frozenset(
            h["rank"] for h in headers.values() if h.get("rank_source", 0) == F.RANK_FROM_GROUP
        )
        now = self.wall()
        ref: Dict[int, Tuple[float, float]] = {}
        verdict: Dict[int, bool] = {}
        for h in headers.values():
            if not counts(h, joined):
                continue
            pid = h["pid"]
            before = self.ref.get(pid)
            if before is not None and now - before[0] < self.INTERVAL_S:
                ref[pid], verdict[pid] = before, self.verdict.get(pid, False)
                continue
            c = self.cpu(pid)
            if c is None:
                continue
            ref[pid] = (now, c)
            verdict[pid] = before is not None and c - before[1] >= BUSY_FRACTION * (now - before[0])
        self.ref, self.verdict = ref, verdict
        return sorted(p for p, b in verdict.items() if b)
