"""The watcher's straggler lines (issue 43): one line in its log when a slow rank starts being
seen, one when it ends; nothing in between (no verdict spam).

In: the ring headers of the run (``watch/headers.py``), read by the ``Watcher`` at each poll.
Out: log lines. Every :data:`CHECK_S` seconds the rings of the live ranks of this node are
read (their compact summaries: ``ring/slotsummary.py``, no new work in the traced
processes) and ``analyze/straggler`` is asked who is slow. A straggler is *seen* from the
first check that names it; it *ends* after :data:`END_CHECKS` checks in a row that do not
name it (one noisy window does not end it), when another rank takes its place (an end line
and a start line), or when no rank of this node is alive any more (:meth:`close`).

A node watcher sees only its node's ranks: on a job of several nodes each compares the ranks
it has (docs/STRAGGLERS.md). The Flight Recorder is not asked here (a DDP job's C++-issued
all-reduces reach the analysis only through ``hangtrace dump``).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Optional

from hangtrace.tracer.ring import reader as R

#: seconds between two straggler checks (each reads the rings of this node's live ranks)
CHECK_S = 5.0
#: checks in a row without it before a straggler ends
END_CHECKS = 2


class StragglerWatch:
    """Straggler start/end lines for one run directory's watcher. ``log``: where the lines
    go; ``clock``: monotonic seconds."""

    def __init__(self, log: Callable[[str], None], clock: Callable[[], float]) -> None:
        self.log = log
        self.clock = clock
        self.next = clock() + CHECK_S
        self.current: Optional[Dict[str, Any]] = None  # details['straggler'] of the one seen
        self.misses = 0

    def check(self, headers: Mapping[str, Any], live: Callable[[str, Any], bool]) -> None:
        """At most every :data:`CHECK_S`: read the live ranks' rings (``headers``: path ->
        header; ``live(path, header)``: alive and not final) and log a start or end. Never raises."""
        now = self.clock()
        if now < self.next:
            return
        self.next = now + CHECK_S
        try:
            procs = self._ranks(headers, live)
            if not procs:
                self.close("no rank of this node is alive")
                return
            from hangtrace.tracer.analyze.straggler import find

            st = find(procs)
            self._note(st.details() if st is not None else None)
        except Exception:
            pass

    def _ranks(self, headers: Mapping[str, Any], live: Callable[[str, Any], bool]) -> Dict[int, Any]:
        """{rank: its ring's history} of the live ranks (newest process per rank)."""
        out: Dict[int, Any] = {}
        started: Dict[int, int] = {}
        for path, h in headers.items():
            rank = h.get("rank", -1)
            if rank < 0 or not live(path, h):
                continue
            t = int(h.get("start_wall_ns") or 0)
            if rank in started and started[rank] > t:
                continue
            try:
                ring = R.read_ring(path, records=False)
            except Exception:
                continue
            if ring.summary is not None:
                out[rank], started[rank] = ring.summary.history, t
        return out

    def _note(self, st: Optional[Dict[str, Any]]) -> None:
        from hangtrace.tracer.report.stragglertext import straggler_phrase

        cur = self.current
        if st is not None and cur is not None and st["rank"] == cur["rank"] and st["group"] == cur["group"]:
            self.misses = 0
            return
        if cur is not None:
            self.misses += 1
            if self.misses < END_CHECKS and st is None:
                return
            self.close(
                "not seen in the last %d checks" % self.misses
                if st is None
                else "rank %s is slower" % st["rank"]
            )
        if st is not None:
            self.current, self.misses = st, 0
            self.log(
                "straggler: %s (group '%s', last in %s of the newest %s steps)"
                % (straggler_phrase(st), st["group"], st.get("last_steps"), st.get("window_steps"))
            )

    def close(self, why: str) -> None:
        """Log the end of the straggler seen, if any (``why``: the reason, in words)."""
        cur = self.current
        if cur is None:
            return
        self.current, self.misses = None, 0
        self.log("straggler ended: rank %s is no longer slow (%s)" % (cur["rank"], why))
