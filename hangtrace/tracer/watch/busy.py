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
once. The end, too: a process that recorded its exit and whose interpreter is still
finalizing (torch's teardown: seen 5+ s at load 30, a 3-rank DDP job called "stuck at exit"
with a 5 s threshold) is busy while it burns CPU; one that sits idle past its exit (an
NCCL communicator's destructor that never returns) is not, and is reported. Not reported, by design: every process spinning outside collectives for ever with
nobody waiting (no distributed wait to explain).

The start (``headers.at_startup``: no process has joined a group yet) is different: there a
process that has not worked yet counts too (the script Lightning re-runs for rank 1, still
importing), and its being busy is the start going on: the watcher dates the quiet spell from
the last poll where a process was busy (``Watcher.poll``), so a rank waiting in the rendezvous
for a peer that imports for minutes at load 20 is not stalled, and the start-up threshold
counts from the moment nothing is busy any more (at most :data:`STARTUP_BUSY_MAX` start-up
thresholds after the watcher began: then it counts as before). A peer that sleeps, blocks or waits for a
lock before the rendezvous is idle and reported after the start-up threshold, as before
(issue 37: 3 of 7 blind Lightning jobs were stopped at start-up at load 12-20).

Not counted: a process with a collective in flight (an NCCL rank spins a CPU while it
waits), after the start a pooled worker that never did any work (Ray's idle workers churn on
start-up), a helper of a rank (a DataLoader worker prefetching), and processes of other hosts.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any, Callable, Dict, FrozenSet, List, Mapping, Optional, Tuple, Union

from hangtrace.tracer.ring import layout as F
from hangtrace.tracer.watch.headers import never_worked

#: The start's busy grace holds for at most this many start-up thresholds
#: (``HANGTRACE_STARTUP_STALL_S``) from the watcher's start: a process spinning for ever
#: before ``init_process_group`` while its peers wait in the rendezvous is still reported
#: (after 10 min by default; Lightning's imports took 49-74 s at load 7-9, 60+ s at 12-20).
STARTUP_BUSY_MAX = 10.0

#: Seconds of CPU demand (run + run-queue wait) per wall second from which a process is busy.
BUSY_FRACTION = 0.5

_HOST = socket.gethostname()
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def thread_demand_s(pid: int) -> Optional[Dict[str, float]]:
    """{thread id: seconds it ran on a CPU or waited on a run queue for one} of ``pid``
    (``/proc/PID/task/TID/schedstat`` fields 1 and 2, ns; the kernel's sched-stats.rst); or,
    without schedstat, {'': user + system CPU time of the process} (``/proc/PID/stat``
    fields 14 and 15, proc(5)). None when the process is gone or unreadable. Never raises.

    Per thread, because a thread that ends takes its figures with it: a sum over the
    threads alive now falls when one ends (seen at a DDP rank's exit, where gloo's and
    our own threads end while the interpreter finalizes), which read as "idle".

    A run-queue wait counts because it is demand: on a loaded machine a process importing
    torch gets a fraction of a core (5 CPU-bound processes on 2 cores: 0.4 each), yet
    wants a whole one; a process that waits on a socket or a lock wants none."""
    try:
        out: Dict[str, float] = {}
        for tid in os.listdir("/proc/%d/task" % pid):
            try:
                with open("/proc/%d/task/%s/schedstat" % (pid, tid), "rb") as f:
                    run_ns, wait_ns = f.read().split()[:2]
                out[tid] = (int(run_ns) + int(wait_ns)) / 1e9
            except FileNotFoundError:
                continue  # a thread that ended meanwhile
        return out
    except (OSError, ValueError):
        pass
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return {"": (int(fields[11]) + int(fields[12])) * _TICK_S}
    except (OSError, ValueError, IndexError):
        return None


def cpu_demand_s(pid: int) -> Optional[float]:
    """The sum of ``thread_demand_s(pid)`` over the threads alive now (seconds), or None.
    Between two readings prefer ``demand_growth``: this sum falls when a thread ends."""
    d = thread_demand_s(pid)
    return None if d is None else sum(d.values())


Demand = Union[float, Mapping[str, float]]


def demand_growth(before: Demand, now: Demand) -> float:
    """Seconds of CPU demand between two readings of one process: per thread when they are
    ``thread_demand_s`` maps (a thread that ended since adds nothing, one that started adds
    its whole demand), else the difference of two totals."""
    if isinstance(before, Mapping) and isinstance(now, Mapping):
        return sum(max(0.0, v - before.get(t, 0.0)) for t, v in now.items())
    total = lambda d: sum(d.values()) if isinstance(d, Mapping) else float(d)  # noqa: E731
    return total(now) - total(before)


def counts(h: Mapping[str, Any], joined_ranks: FrozenSet[int], startup: bool = False) -> bool:
    """Whether the header's process may hold the grace: of this host (alive, or past its exit
    record and still finalizing) and not the watcher's own, no collective in flight, past "never worked" (a rank, a phase
    or progress) unless the run is ``startup`` (``headers.at_startup``), and not a helper of a
    rank (its rank hint from the environment is held by a process that joined a group as that
    rank)."""
    # (a header that says exited while its pid lives counts: the interpreter is finalizing,
    # torch's and its libraries' teardown, 5-25 s at load 20-30 on 2 cores; a gone or zombie
    # process has no CPU demand to read)
    if h.get("host") != _HOST or h.get("inflight_idx") or h.get("pid") == os.getpid():
        return False  # (the watcher's own process: its polling is not the job working)
    if never_worked(h) and not startup:
        return False
    rank = h.get("rank", -1)
    helper = rank >= 0 and h.get("rank_source", 0) == F.RANK_FROM_ENV and rank in joined_ranks
    return not helper


class BusyClock:
    """CPU time of the watched processes across polls.

    ``busy(headers)`` returns the pids (this host) whose CPU demand (``thread_demand_s``)
    grew by at least ``BUSY_FRACTION`` of the wall time over the last ``INTERVAL_S`` or more (measured on
    ``wall``, a monotonic clock in seconds: CPU per real second, whatever clock the
    watcher judges stalls by; shorter intervals are noise, as /proc/PID/stat counts
    CPU in 10 ms ticks, and keep the last verdict); ``startup``: the run is starting
    (``counts``). ``cpu`` and ``wall`` are injectable for tests."""

    INTERVAL_S = 1.0

    def __init__(
        self,
        cpu: Callable[[int], Optional[Demand]] = thread_demand_s,
        wall: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cpu, self.wall = cpu, wall
        self.ref: Dict[int, Tuple[float, Demand]] = {}  # pid -> (wall s, demand) at the last verdict
        self.verdict: Dict[int, bool] = {}

    def busy(self, headers: Mapping[str, Mapping[str, Any]], startup: bool = False) -> List[int]:
        joined = frozenset(
            h["rank"] for h in headers.values() if h.get("rank_source", 0) == F.RANK_FROM_GROUP
        )
        now = self.wall()
        ref: Dict[int, Tuple[float, Demand]] = {}
        verdict: Dict[int, bool] = {}
        for h in headers.values():
            if not counts(h, joined, startup):
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
            verdict[pid] = before is not None and demand_growth(before[1], c) >= BUSY_FRACTION * (
                now - before[0]
            )
        self.ref, self.verdict = ref, verdict
        return sorted(p for p, b in verdict.items() if b)
