"""Heartbeats: a framework's periodic call into a process proves it alive, never that it trained.

Ray Train V2 (ray 2.60, measured 2026-12-07): its controller calls ``poll_status`` on every
worker actor about every 2 s; our Ray hook records each call as a phase (enter and exit,
0.1-0.2 ms apart, nothing inside), and each phase change counted as progress: a worker stuck
outside collectives, or a rank whose peer skipped a step, was never reported. A health check
or a metrics pull is the same shape.

A phase *name* of one process is a heartbeat when its calls, read from the records:

* return quickly: every completed call lasted at most :data:`MAX_CALL_NS`, none failed;
* hold nothing: no collective, p2p, step, explicit heartbeat or other phase was recorded on
  the calling thread between its enter and exit (memory samples and Ray waits aside);
* recur periodically: at least :data:`MIN_CALLS` such calls, the intervals between the
  starts of the last ``MIN_CALLS + 1`` at least :data:`MIN_PERIOD_NS` and each within a
  factor :data:`PERIOD_SPREAD` of their median (a work loop calling a short method back to back is not periodic idle).

One bad call (long, failed, or with work inside) makes the name no heartbeat for good. The
classifier is incremental (:class:`HeartbeatBook`, fed records in index order) so the watcher
(``watch/detector.py``: new slots of a changed ring) and the analysis (``analyze/rankview``:
a process's records) decide alike. Keys are opaque: the watcher passes string ids, the
analysis names. Times are ns (monotonic).
"""

from __future__ import annotations

from typing import Any, Dict, FrozenSet, Hashable, Iterable, List, Mapping, Optional, Set, Tuple

#: longest call of a heartbeat (ns): Ray Train's poll_status takes 0.1-0.2 ms; 250 ms leaves
#: room for a loaded 2-core machine
MAX_CALL_NS = 250_000_000
#: calls seen before a name is a heartbeat
MIN_CALLS = 3
#: shortest median interval between two calls (ns)
MIN_PERIOD_NS = 500_000_000
#: each interval within [median / SPREAD, median * SPREAD]
PERIOD_SPREAD = 2.0
#: record kinds that are work when recorded inside a call
WORK_KINDS = frozenset({"collective", "p2p", "step", "heartbeat", "phase_enter"})
#: record kinds that neither prove work nor spoil a call (a memory sample, a Ray wait)
NEUTRAL_KINDS = frozenset({"memory", "ray_wait"})


class HeartbeatBook:
    """Which phase names of one process are heartbeats (module docstring); fed with
    :meth:`feed` in record order."""

    def __init__(self) -> None:
        self.open: Dict[Hashable, Tuple[Hashable, int, bool]] = {}  # thread -> (phase, t enter, clean)
        self.starts: Dict[Hashable, List[int]] = {}  # phase -> start times of its clean calls
        self.bad: Set[Hashable] = set()

    def is_beat(self, phase: Optional[Hashable]) -> bool:
        """Is ``phase`` a heartbeat of this process (so far)?"""
        if phase is None or phase in self.bad:
            return False
        st = self.starts.get(phase) or []
        if len(st) < MIN_CALLS:
            return False
        recent = st[-(MIN_CALLS + 1) :]  # the recent calls decide (a slow first call is no verdict)
        gaps = sorted(b - a for a, b in zip(recent, recent[1:]))
        med = gaps[len(gaps) // 2]
        return med >= MIN_PERIOD_NS and all(med / PERIOD_SPREAD <= g <= med * PERIOD_SPREAD for g in gaps)

    def feed(
        self, kind: str, phase: Optional[Hashable], thread: Hashable, t_mono_ns: int, failed: bool = False
    ) -> bool:
        """Take one record; True when it is progress (work, or a phase that is no heartbeat),
        False for a heartbeat's enter or exit and for neutral records."""
        if kind in NEUTRAL_KINDS:
            return False
        cur = self.open.get(thread)
        if kind == "phase_enter":
            if cur is not None:
                self.open[thread] = (cur[0], cur[1], False)  # a phase inside: work
            self.open[thread] = (phase, t_mono_ns, True) if cur is None else self.open[thread]
            if cur is not None:
                self.bad.add(phase)  # nested: never a heartbeat itself
            return not self.is_beat(phase)
        if kind == "phase_exit":
            beat = self.is_beat(phase)
            if cur is not None and cur[0] == phase:
                del self.open[thread]
                if cur[2] and not failed and t_mono_ns - cur[1] <= MAX_CALL_NS:
                    st = self.starts.setdefault(phase, [])
                    st.append(cur[1])
                    del st[:-16]  # the recent calls decide
                else:
                    self.bad.add(phase)
                    beat = False
            return not beat
        if cur is not None and kind in WORK_KINDS:
            self.open[thread] = (cur[0], cur[1], False)
        return True


#: record kinds that are progress (``ring/summary.py``'s ``last_progress``)
PROGRESS_KINDS = frozenset({"collective", "p2p", "step", "heartbeat", "phase_enter", "phase_exit", "group"})


def heartbeat_names(records: Iterable[Mapping[str, Any]]) -> FrozenSet[Any]:
    """The phase names that are heartbeats over one process's records (in index order)."""
    book = HeartbeatBook()
    for r in records:
        kind = str(r.get("kind") or "")
        if kind in PROGRESS_KINDS or kind in NEUTRAL_KINDS or kind == "event":
            book.feed(
                kind,
                r.get("phase"),
                r.get("thread"),
                int(r.get("t_mono_ns") or 0),
                r.get("state") == "failed",
            )
    return frozenset(n for n in book.starts if book.is_beat(n))


def newest_work_wall(records: Iterable[Mapping[str, Any]]) -> Tuple[int, bool]:
    """Over one process's records (in index order): ``(wall ns of its newest progress record
    that is no heartbeat's (0: none), whether a heartbeat's record came after it)``. The
    analysis's "last progress" of a rank whose newest progress record is a phase's; with
    every record known, a name found to be a heartbeat is one for all its calls."""
    recs = [r for r in records if str(r.get("kind") or "") in PROGRESS_KINDS | NEUTRAL_KINDS | {"event"}]
    book = HeartbeatBook()
    for r in recs:
        book.feed(
            str(r.get("kind")),
            r.get("phase"),
            r.get("thread"),
            int(r.get("t_mono_ns") or 0),
            r.get("state") == "failed",
        )
    newest, beat_after = 0, False
    for r in recs:
        kind = str(r.get("kind"))
        if kind not in PROGRESS_KINDS:
            continue
        if kind in ("phase_enter", "phase_exit") and book.is_beat(r.get("phase")):
            beat_after = True
        else:
            newest, beat_after = int(r.get("t_wall_ns") or 0), False
    return newest, beat_after
