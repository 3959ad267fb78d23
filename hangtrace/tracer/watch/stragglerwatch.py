"""The watcher's straggler lines (issue 43): one line in its log when a slow rank starts being
seen, one when it ends; nothing in between (no verdict spam).

In: the ring headers of the run (``watch/headers.py``), read by the ``Watcher`` at each poll.
Out: log lines. Every few seconds (:func:`interval`: a quarter of the time the ranks'
history spans, 0.5-5 s, and at least 50 x the check's own CPU time) the rings of the live
ranks of this node are read (their compact summaries: ``ring/slotsummary.py``, no new work in the traced
processes) and ``analyze/straggler`` is asked who is slow. A straggler is *seen* from the
first check that names it; it *ends* after :data:`END_CHECKS` checks in a row that do not
name it (one noisy window does not end it), when another rank takes its place (an end line
and a start line), or when no rank of this node is alive any more (:meth:`close`).

Since when (the analysis's window holds 10-40 steps; a slowdown older than that has no start
in ``dump``/``analyze``): each episode is kept in ``RUN_DIR/stragglers-<host>.json``
(``tracer/stragglerseen.py``, written atomically when it changes: at its start, when a later
check whose window still holds the start finds it again - more slow steps after it place it
better -, at its end). ``dump``/``analyze`` read it (``analyze/straggler/seen.py``).

A node watcher sees only its node's ranks: on a job of several nodes each compares the ranks
it has (docs/STRAGGLERS.md). When the rings name nobody, the ranks' Flight Recorder is asked
at a low rate (``stragglerfr.py``: a DDP job's C++-issued all-reduces exist only there).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from hangtrace.tracer.ring import layout as F
from hangtrace.tracer.ring import reader as R
from hangtrace.tracer.watch.stragglerfr import FrLook
from hangtrace.tracer.stragglerseen import MAX_ENTRIES, SeenStraggler, read_file, write_seen

#: longest time between two straggler checks, s (each reads the rings of this node's live ranks)
CHECK_S = 5.0
#: shortest time between two checks, s (the watcher polls every second by default)
MIN_CHECK_S = 0.5
#: checks per time span of the ranks' history (the start of a slowdown stays findable for
#: about that span less the 12 steps detection and change point need: several chances)
CHECKS_PER_SPAN = 4
#: a check may cost at most 1/COST_SHARE of the interval that follows it (CPU time of the
#: watcher's thread): at most 2 % of a core on a node of many ranks
COST_SHARE = 50.0
#: checks in a row without it before a straggler ends
END_CHECKS = 2


class StragglerWatch:
    """Straggler start/end lines for one run directory's watcher. ``log``: where the lines
    go; ``clock``: monotonic seconds; ``seen_file``: where its episodes are kept
    (``stragglerseen.seen_path``; None: nowhere); ``wall_ns``: the wall clock; ``host``: its host."""

    def __init__(
        self,
        log: Callable[[str], None],
        clock: Callable[[], float],
        seen_file: Optional[str] = None,
        wall_ns: Callable[[], int] = time.time_ns,
        host: str = "",
        fr: Optional[FrLook] = None,
    ) -> None:
        self.log = log
        self.clock = clock
        self.next = clock() + MIN_CHECK_S
        self.current: Optional[Dict[str, Any]] = None  # details['straggler'] of the one seen
        self.misses = 0
        self.seen_file = seen_file
        self.wall_ns = wall_ns
        self.host = host
        self.latest: Optional[Dict[str, Any]] = None  # its newest figures (kept at its end)
        self.fr = fr  # Flight Recorder rounds (stragglerfr.py); None: the rings alone
        self.via_fr = False  # the straggler seen was named by a Flight Recorder round
        self.episodes: List[SeenStraggler] = []  # this watcher's, oldest first (the file's content)
        self.judged = False  # a check judged rings: the analysis' modules are imported
        self.rings: Dict[str, Tuple[Any, Any]] = {}  # path -> (header, its ring) at the last check
        if seen_file is not None:  # a restarted watcher keeps the episodes of its run
            self.episodes = [e for e in read_file(seen_file)[0] if e.host == host]

    def check(self, headers: Mapping[str, Any], live: Callable[[str, Any], bool]) -> None:
        """At most every :data:`CHECK_S`: read the live ranks' rings (``headers``: path ->
        header; ``live(path, header)``: alive and not final) and log a start or end. Never raises."""
        now = self.clock()
        if now < self.next:
            return
        self.next = now + CHECK_S
        cpu = time.thread_time()
        try:
            rings = self._ranks(headers, live)
            if not rings:
                self.next = now + 2 * MIN_CHECK_S  # (the ranks start: their rings are new)
                self.close("no rank of this node is alive")
                return
            procs = {r: ring.summary.history for r, ring in rings.items()}
            self._judge(procs, rings)
            # the first judgement's CPU is mostly imports: counted, it put the next check 25 s
            # away and a quiet machine's 60 ms steps had scrolled the start out (CI mimic 16:14)
            cost = time.thread_time() - cpu if self.judged else 0.0
            self.judged = True
            self.next = now + interval(span_s(procs), cost)
        except Exception:
            pass

    def _judge(self, procs: Mapping[int, Any], rings: Mapping[int, Any]) -> None:
        """Who is slow in the rings' histories ``procs``; when nobody, in them joined with the
        Flight Recorder (``stragglerfr``: DDP's C++-issued all-reduces) when a round is due. A
        straggler seen only through the Flight Recorder is judged again only by a round (the
        rings alone never name it: no word on it in between)."""
        from hangtrace.tracer.analyze.straggler import find

        st = find(procs)
        if st is None and self.fr is not None:
            rounds = self.fr.rounds
            joined = self.fr.histories(rings)
            if joined is not None:
                st = find(joined)
            if self.fr.rounds == rounds and self.via_fr and self.current is not None:
                return  # no round now: no word on the straggler the last round named
            self.via_fr = st is not None and joined is not None
        elif st is not None:
            self.via_fr = False
        self._note(st.details() if st is not None else None)

    def _ranks(self, headers: Mapping[str, Any], live: Callable[[str, Any], bool]) -> Dict[int, Any]:
        """{rank: its ring (``RingData``, the summary only)} of the live ranks: per rank the
        process that joined a process group (a DataLoader worker inherits its rank's RANK but
        joins none: the blind job tr_ddp_cpu_contention's watcher read its workers' empty
        rings and never saw rank 2), the newest of them."""
        best: Dict[int, Any] = {}
        for path, h in headers.items():
            rank = h.get("rank", -1)
            if rank < 0 or not live(path, h):
                continue
            key = (h.get("rank_source", 0) == F.RANK_FROM_GROUP, int(h.get("start_wall_ns") or 0))
            if rank not in best or key > best[rank][0]:
                best[rank] = (key, path)
        out: Dict[int, Any] = {}
        cache: Dict[str, Tuple[Any, Any]] = {}
        for rank, (_, path) in best.items():
            h = headers[path]
            held = self.rings.get(path)
            if held is not None and held[0] is h:  # (the same header: progress.HeaderCache)
                ring = held[1]
            else:
                try:
                    ring = R.read_ring(path, records=False)
                except Exception:
                    continue
            cache[path] = (h, ring)
            if ring.summary is not None:
                out[rank] = ring
        self.rings = cache  # a ring whose header did not change since is not read again
        return out

    def _note(self, st: Optional[Dict[str, Any]]) -> None:
        from hangtrace.tracer.report.stragglertext import straggler_phrase

        cur = self.current
        if st is not None and cur is not None and st["rank"] == cur["rank"] and st["group"] == cur["group"]:
            self.misses = 0
            self.latest = st
            self._refine(st)
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
            self.current, self.misses, self.latest = st, 0, st
            self._begin(st)
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
        if self.episodes and self.episodes[-1].ended_wall_ns is None:
            e = self.episodes.pop()
            self._keep(dataclasses.replace(e, ended_wall_ns=self.wall_ns(), last=self.latest or e.last))
        self.latest = None
        self.log("straggler ended: rank %s is no longer slow (%s)" % (cur["rank"], why))

    def _begin(self, st: Mapping[str, Any]) -> None:
        """A new episode: its first slow step if this window holds it, else the window's oldest."""
        since = st.get("since_step")
        self._keep(
            SeenStraggler(
                rank=int(st["rank"]),
                group=str(st["group"]),
                since_step=since,
                before_step=st.get("oldest_step") if since is None else None,
                first_seen_step=st.get("newest_step"),
                first_seen_wall_ns=self.wall_ns(),
                host=self.host,
                last=dict(st),
            )
        )

    def _refine(self, st: Mapping[str, Any]) -> None:
        """A later check of the same episode: its first slow step replaces the one kept when it
        is earlier and the window still holds the start kept (its oldest step at or before
        it); when no start was kept, when it is at or before the step the episode was first
        seen at (the rank was slow then: a change point after it is a change within the
        episode)."""
        e = self.episodes[-1] if self.episodes else None
        since, oldest = st.get("since_step"), st.get("oldest_step")
        if e is None or e.ended_wall_ns is not None or since is None or since == e.since_step:
            return
        if e.first_seen_step is not None and since > e.first_seen_step:
            return
        if e.since_step is not None and (
            since > e.since_step or (oldest is not None and oldest > e.since_step)
        ):
            # later than the start kept: a change of its level inside the episode (measured:
            # +9 ms from step 20, +28 ms later: a window of steps 12-84 put the start at 28);
            # or the window has moved past the start: what it finds now is noise or later
            return
        self.episodes.pop()
        self._keep(dataclasses.replace(e, since_step=since, before_step=None))

    def _keep(self, e: SeenStraggler) -> None:
        """``e`` as the newest episode, written to the file (never raises)."""
        self.episodes = (self.episodes + [e])[-MAX_ENTRIES:]
        if self.seen_file is None:
            return
        try:
            write_seen(self.seen_file, self.episodes)
        except OSError:
            pass


def span_s(histories: Mapping[int, Any]) -> float:
    """The time the shortest of ``{rank: RingSummary.history}`` spans, s (newest minus oldest
    wall time of its records; 0 when unknown)."""
    spans = []
    for hist in histories.values():
        ts = [int(r.get("t_wall_ns") or 0) for r in hist if isinstance(r, Mapping)]
        ts = [t for t in ts if t > 0]
        if ts:
            spans.append((max(ts) - min(ts)) / 1e9)
    return min(spans) if spans else 0.0


def interval(span: float, cost_s: float) -> float:
    """Seconds to the next check: a :data:`CHECKS_PER_SPAN` th of the history's span (so a
    slowdown's start is checked while it is still recorded), at least :data:`MIN_CHECK_S`,
    at most :data:`CHECK_S` - and at least :data:`COST_SHARE` times the check's CPU time
    (measured: 28 ms per check of 4 ranks at load 13; a node of 64 ranks checks less often)."""
    # no span yet (the ranks' histories hold no timed record: they are starting): soon again,
    # the check of empty rings is cheap (at CHECK_S, a job's first slow steps were first
    # seen 26-36 steps late beside a CPU burner and the start was no longer in the window)
    want = span / CHECKS_PER_SPAN if span > 0 else 2 * MIN_CHECK_S
    return max(COST_SHARE * cost_s, min(CHECK_S, max(MIN_CHECK_S, want)))
