"""The watcher's look at C++-issued collectives for stragglers (issue 43): DDP's gradient
all-reduce (and FSDP's) is issued by torch's C++ reducer, never by our wrappers, so a DDP
job's rings hold none of the collectives its ranks wait in and the rings name nobody; only
torch's Flight Recorder has them.

In: the rings this node's watcher read (``ring.reader.RingData`` per live rank). Out: their
histories joined with a fresh Flight Recorder dump of each rank (``ring/frjoin.join_fr``:
the same join ``hangtrace dump`` makes), or None when not due. The dumps are asked of the
ranks' agents (``collect/frrequest.request_fr_dumps``, the files in ``RUN_DIR/fr``, which
``dump``/``analyze`` read too).

Cost, bounded (benchmarks/bench_straggler_fr.py measures one round):

* only when the rings alone name nobody and the run has Flight Recorder agents
  (``RUN_DIR/fr``);
* at most one round (one dump per rank of this node) every :data:`FR_EVERY_S` seconds, and
  at least :data:`COST_SHARE` times the last round's CPU time apart (measured: 17 ms of CPU
  per dump in a rank, 0.42 s of the watcher's CPU per round over 4 ranks at load 13: 1.4 %
  of a core at one round per 30 s);
* a round whose dumps add no collective the rings lack (every collective of the job is
  Python-issued: the rings saw them all) doubles the interval, up to :data:`FR_IDLE_S`; a
  round that adds some resets it.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Dict, List, Mapping, Optional

#: seconds between two Flight Recorder rounds while they add collectives the rings lack
FR_EVERY_S = 30.0
#: longest interval, s, once the rounds add nothing (a job whose collectives are all Python-issued)
FR_IDLE_S = 600.0
#: seconds after the watcher starts before the first round (the ranks import, join, warm up:
#: an early round's dumps are empty, and an empty round is no reason to slow down)
FR_FIRST_S = 15.0
#: a round's CPU time (parsing each rank's dump of 2000 entries, the join) times this is the
#: least interval after it
COST_SHARE = 50.0
#: seconds a round waits in all for the agents' answers (the dump of a rank takes milliseconds)
FR_TIMEOUT_S = 2.0


def fr_only(hist: Any) -> int:
    """Collectives of a joined history that only the Flight Recorder has (C++-issued: no
    ring record of ours matched them)."""
    from hangtrace.tracer.ring.frrecords import FR_SOURCE

    return sum(
        1
        for r in hist or ()
        if isinstance(r, Mapping) and r.get("kind") == "collective" and r.get("source") == FR_SOURCE
    )


class FrLook:
    """Flight Recorder rounds of one watcher (``run_dir``; ``clock``: monotonic seconds).
    ``used``: whether the last answer of :meth:`histories` came from a round (a straggler
    seen there can be seen ended only by another round: the rings alone never name it)."""

    def __init__(self, run_dir: str, clock: Callable[[], float]) -> None:
        self.run_dir = run_dir
        self.clock = clock
        self.every = FR_EVERY_S
        self.next = clock() + FR_FIRST_S
        self.rounds = 0
        self.entries = 0  # Flight Recorder entries of the last round's dumps

    def due(self) -> bool:
        """A round may run now (the run has agents and the interval has passed)."""
        from hangtrace.hooks.torchdist.fr_agent import fr_dir

        return self.clock() >= self.next and os.path.isdir(fr_dir(self.run_dir))

    def histories(self, rings: Mapping[int, Any]) -> Optional[Dict[int, Any]]:
        """``{rank: history}`` of ``rings`` (``{rank: RingData}``, this host's live ranks)
        joined with a dump of each, or None (not due, no agent answered, or nothing added).
        Never raises."""
        if not rings or not self.due():
            return None
        self.next = self.clock() + self.every
        self.rounds += 1
        self.entries = 0
        cpu = time.thread_time()
        try:
            joined = self._round(rings)
        except Exception:
            joined = None
        cpu = time.thread_time() - cpu
        added = joined is not None and any(fr_only(h) > 0 for h in joined.values())
        idle = not added and self.entries > 0  # dumps with entries, none the rings lack
        self.every = min(FR_IDLE_S, 2 * self.every) if idle else FR_EVERY_S
        self.every = max(self.every, COST_SHARE * cpu)  # at most 2 % of a core (many ranks per node)
        # no entry yet (the ranks still start): the next round as soon as the first one
        self.next = self.clock() + (self.every if self.entries else max(FR_FIRST_S, COST_SHARE * cpu))
        return joined if added else None

    def _round(self, rings: Mapping[int, Any]) -> Optional[Dict[int, Any]]:
        from hangtrace.tracer.collect.frdump import read_fr_file
        from hangtrace.tracer.collect.frrequest import request_fr_dumps
        from hangtrace.tracer.collect.ringprocs import process_from_ring
        from hangtrace.tracer.ring.frjoin import join_fr

        by_pid = {int(ring.header["pid"]): r for r, ring in rings.items()}
        dumps: List[Any] = []
        for path in request_fr_dumps(self.run_dir, list(by_pid), timeout_s=FR_TIMEOUT_S, settle_s=0.5):
            try:
                dumps.append(read_fr_file(path))
            except Exception:
                continue
        self.entries = sum(len(d.entries) for d in dumps)
        if not dumps:
            return None
        procs = [process_from_ring(ring, state="alive") for ring in rings.values()]
        return {p.rank: p.summary.history for p in join_fr(procs, dumps) if p.rank in rings and p.summary}
