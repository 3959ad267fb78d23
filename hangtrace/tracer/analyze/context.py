"""The analysis context: one indexed view per rank and the shared state of one
``diagnose()`` call (pure).

In: a ``Snapshot`` (and the run's environment records). Out: a :class:`Ctx`: per rank a
``rankview.RankView`` (built by ``rankview.index_process``, deaths filled by
``failures/deaths.fill_death``, teardown marked by ``failures/teardown.mark``), the groups,
the ranks without a record file, staleness (for a live snapshot judged over a window, the
window: :func:`judged_window`).

Index (``rankview``; one pass over each process's records, O(records)): per group the record with the
highest ``seq`` of kind 'collective' (the ring may have wrapped: only the per-group
maximum is trusted, never history from seq 1); per ``(group, peer)`` the highest p2p
record; the record the rank is *blocked* in: ``ProcessInfo.inflight``, else its newest
collective/p2p record if that is still 'issued' (not async), or 'failed' with a
transport error (it was waiting there when the transport gave up). Group membership
comes from the group definitions of every process (``groups``); a group nobody defined
gets the ranks seen using it (the default group ``'0'`` / 'default_pg' gets
``range(world_size)``). Processes with ``rank < 0`` are ignored; of two processes
claiming one rank the later-started one is used. Ranks of ``range(world_size)`` with no
process are reported as "no record file". Times are ns since the epoch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

from hangtrace.tracer.analyze.failures import elastic, teardown
from hangtrace.tracer.analyze.failures.lonerestart import lone_restarts
from hangtrace.tracer.analyze.failures.deaths import fill_death, sigterm_in_long_wait, sigterm_wait_completed
from hangtrace.tracer.analyze.rankview import Record, RankView, index_process
from hangtrace.tracer.process_model import ProcessRoles, assign_roles
from hangtrace.tracer.envfacts import ProcessEnv
from hangtrace.tracer.ring.summary import in_stream_order, record_key
from hangtrace.tracer.snapshot import ProcessInfo, ProgressWindow, Snapshot

if TYPE_CHECKING:
    from hangtrace.tracer.analyze.graph.waitgraph import Inst

#: A group definition: ``{'name', 'desc', 'backend', 'ranks', 'inferred', 'order'}``.
GroupDef = Dict[str, Any]


DEFAULT_STALL_S = 300.0
#: seconds beyond a live snapshot's window within which a moved rank's newest work must lie
#: for the move to count as work (``_beats_only``)
WINDOW_SLACK_S = 1.0
#: Larger world sizes (and ranks) in a ring header are corrupt/implausible: ignored, so
#: that one bad header cannot make the analysis allocate per-rank structures unboundedly.
MAX_WORLD = 1 << 20
#: At most this many ranks without a record file are listed (``missing_ranks``).
MAX_MISSING_LISTED = 65536


def history(proc: ProcessInfo) -> List[Record]:
    """The records the snapshot keeps of ``proc`` (the summary's and its recent tail),
    once each, oldest first: what rules that look back (per-step counts, failed phases)
    can read. Decodes the tail on access."""
    seen: Dict[Any, Record] = {}
    tail = proc.summary.tail if proc.summary is not None else ()
    for r in (*(proc.records or ()), *tail):
        seen.setdefault(record_key(r), r)
    return in_stream_order(seen.values())


def judged_window(
    snapshot: Snapshot, views: Dict[int, RankView]
) -> Tuple[Optional[ProgressWindow], Tuple[int, ...], int]:
    """The ring window of a live snapshot not taken at a detected stall or death, the ranks
    that advanced in it and how many processes did (``(None, (), 0)`` otherwise; a rank
    whose ring moved by a framework's heartbeats alone did not advance, ``_beats_only``). A point in time catches healthy
    ranks a few milliseconds apart - one in a collective, its peer not there yet - so such a
    snapshot is judged hung only when no process advanced between the two readings of the
    ring headers and torch's counters (``watch/progress.py``, the watcher's definition of
    progress; measured 2026-12-07: 1 of 25 and 4 of 37 point-in-time ``dump``s of a healthy
    DDP job gave a hang verdict). When nothing advanced, the hang rules may judge it."""
    w = snapshot.window
    if w is None or w.source != "rings" or snapshot.reason in ("stall", "death"):
        return None, (), 0
    beats = {v.proc.key for v in views.values() if v.proc.key in w.advanced and _beats_only(v, w, snapshot)}
    moved = set(w.advanced) - beats
    return w, tuple(sorted(r for r, v in views.items() if v.proc.key in moved)), len(moved)


def _beats_only(v: RankView, w: ProgressWindow, snapshot: Snapshot) -> bool:
    """The ring of ``v`` moved in the window ``w`` but its newest work (``progress_wall``,
    which passes over a framework's heartbeats such as Ray Train's ``poll_status``:
    ``ring/heartbeats.py``) is older than the window before the snapshot: the move was
    heartbeats, which prove the process alive, not that it worked. A move whose records came
    after the snapshot was read is discounted too; the hang rules then judge it, and
    staleness is still the stall threshold's, so that costs no false hang."""
    taken = snapshot.taken_wall_ns or 0
    if not taken or not v.progress_wall:
        return False
    return v.progress_wall < taken - int((w.window_s + WINDOW_SLACK_S) * 1e9)


def plausible_world(ws: Any) -> int:
    """``ws`` when it is a plausible world size (1..MAX_WORLD), else 0 (unknown)."""
    try:
        n = int(ws)
    except (TypeError, ValueError):
        return 0
    return n if 0 < n <= MAX_WORLD else 0


class Ctx:
    """Shared state of one diagnose() call: the rank views, groups, ranks without a
    record file, evidence lines, staleness, and (set by ``diagnose``) the wait-for graph
    ``insts`` / ``inst_of``. ``cache`` memoises derived analyses (chain ends, cycles)
    for the rules; ``reset_graph`` clears it."""

    def __init__(
        self,
        snapshot: Snapshot,
        now_wall_ns: Optional[int],
        stall_s: Optional[float],
        envs: Sequence[ProcessEnv] = (),
    ) -> None:
        self.snap = snapshot
        self.envs: Tuple[ProcessEnv, ...] = tuple(envs)  # the run's environment records (may be none)
        self.views: Dict[int, RankView] = {}
        self.evidence: List[str] = []
        self.dups: List[Tuple[int, str, str, Tuple[str, ...]]] = []  # (rank, kind, kept, others)
        self.unranked = 0
        self.bad: List[str] = []  # evidence lines: implausible rank/world_size in a ring header
        self.procs: Dict[int, ProcessInfo] = self._choose(snapshot)
        by_key, by_pid = elastic.index(snapshot.processes)  # torchelastic's error files
        helpers: Dict[int, List[str]] = {}
        for k, hr in self.roles.helper_of.items():
            helpers.setdefault(hr, []).append(k)
        procs_by_key = {p.key: p for p in snapshot.processes}
        for r, p in self.procs.items():
            v = index_process(r, p)
            fill_death(
                v,
                elastic.for_rank(p, helpers.get(r, ()), by_key, by_pid) if by_key else None,
                [procs_by_key[k] for k in helpers.get(r, ()) if k in procs_by_key],
            )
            self.views[r] = v
        self.world = max(self._worlds + [0])
        if self.views:
            self.world = max(self.world, max(self.views) + 1)
        self.groups: Dict[str, GroupDef] = self._groups()
        for v in self.views.values():
            if v.victim and sigterm_in_long_wait(v) and sigterm_wait_completed(self, v):
                v.victim = False  # the others completed the collective it waited in: not hung
        for v in teardown.stopped_idle_actors(self):  # an idle Ray actor SIGTERMed from outside died
            fill_death(v, stopped=True)
        teardown.mark(self)  # SIGTERMed by Ray after another rank failed: Ray stopping the job
        # ranks of range(world) without a record file; at most MAX_MISSING_LISTED listed
        # (self.nmissing counts them all) - never a set of range(world)
        self.nmissing = max(0, self.world - len(self.views))
        self.nofile: List[int] = []
        if self.nmissing:
            for r in range(self.world):
                if r not in self.views:
                    self.nofile.append(r)
                    if len(self.nofile) >= MAX_MISSING_LISTED:
                        break
        # progress, not any record: a memory sample every second is a sign of life, not of
        # progress (it made every rank look as if it progressed a second ago); a rank that
        # never progressed counts from its start
        times = [
            v.progress_wall or v.proc.start_wall_ns
            for v in self.views.values()
            if v.progress_wall or v.proc.start_wall_ns
        ]
        self.last_progress = max(times) if times else 0
        self.now = now_wall_ns or snapshot.taken_wall_ns or self.last_progress
        self.age_s = (self.now - self.last_progress) / 1e9 if self.last_progress and self.now else None
        self.stall_s = DEFAULT_STALL_S if stall_s is None else stall_s
        self.stalled = snapshot.reason in ("stall",) or (
            self.age_s is not None and self.age_s >= self.stall_s
        )
        self.window, self.advanced, self.advanced_processes = judged_window(snapshot, self.views)
        self.advanced_in_window = self.advanced_processes > 0
        # processes whose ring vanished between the window's readings (the run directory
        # deleted during the dump): not known to be still, so the window cannot show the job
        # hung; only the stall threshold can (diagnose._graph)
        self.unread_in_window: Tuple[str, ...] = self.window.unread if self.window is not None else ()
        self._judge_window()
        self.insts: Dict[Any, Inst] = {}
        self.inst_of: Dict[int, Inst] = {}
        self.cache: Dict[str, Any] = {}

    def _judge_window(self) -> None:
        """A live snapshot judged over a window (issue 38) in which a process advanced: not
        stalled (``diagnose`` then runs no hang rule), its last progress within the window
        (torch's counters may have moved while the ring did not: C++ collectives). When
        nothing advanced, the hang rules judge the snapshot and staleness stays the stall
        threshold's: two seconds without progress make no stall (a step of long compute)."""
        if self.window is None or not self.advanced_in_window:
            return
        self.stalled = False
        if self.age_s is None or self.age_s > self.window.window_s:
            self.age_s = self.window.window_s

    def _choose(self, snapshot: Snapshot) -> Dict[int, ProcessInfo]:
        """The process analysed per rank, by the process model (``tracer.process_model``:
        the process that joined a group as rank r; helpers that inherited RANK never stand
        for it; restarts and conflicts go to ``dups``); records implausible headers."""
        self._worlds: List[int] = []
        valid: List[ProcessInfo] = []
        for p in snapshot.processes:
            ws = plausible_world(p.world_size)
            if p.world_size is not None and p.world_size > MAX_WORLD:
                self.bad.append(
                    "process %s: implausible world_size %s in its ring header: ignored "
                    "(world size treated as unknown)" % (p.key, p.world_size)
                )
            rank: Optional[int] = p.rank
            if rank is not None and (rank < -1 or rank >= MAX_WORLD or (ws and rank >= ws)):
                self.bad.append(
                    "process %s: implausible rank %s%s in its ring header: "
                    "treated as unranked" % (p.key, rank, " (world size %d)" % ws if ws else "")
                )
                rank = None
            if rank is None or rank < 0:
                self.unranked += 1
                continue
            if ws:
                self._worlds.append(ws)
            valid.append(p)
        self.roles: ProcessRoles = assign_roles(valid)
        for c in self.roles.claims:
            self.dups.append((c.rank, c.kind, c.kept, c.others))
        ranks = dict(self.roles.ranks)
        # a rank restarted alone: the process that died stands for it (analyze/failures/lonerestart.py)
        self.replaced: Dict[int, Tuple[ProcessInfo, ProcessInfo]] = lone_restarts(ranks, self.dups, valid)
        for r, (prev, _new) in self.replaced.items():
            ranks[r] = prev
        return ranks

    def _groups(self) -> Dict[str, GroupDef]:
        groups: Dict[str, GroupDef] = {}
        seen: Dict[Any, List[int]] = {}
        for r, v in self.views.items():
            for g in v.last:
                seen.setdefault(g, []).append(r)
            for g, _peer in v.p2p:
                seen.setdefault(g, []).append(r)
        for p in self.procs.values():
            for gd in p.groups or ():
                if not isinstance(gd, dict) or gd.get("name") is None:
                    continue
                name = str(gd["name"])
                if name in groups and groups[name].get("ranks"):
                    continue
                ranks = gd.get("ranks")
                groups[name] = {
                    "name": name,
                    "desc": gd.get("desc"),
                    "backend": gd.get("backend"),
                    "ranks": sorted(int(x) for x in ranks) if ranks else None,
                    "inferred": False,
                    "order": gd.get("order"),
                }
        for name, rs in seen.items():
            gdef = groups.get(name)
            if gdef is None:
                gdef = groups[name] = {
                    "name": name,
                    "desc": None,
                    "backend": None,
                    "ranks": None,
                    "inferred": True,
                    "order": None,
                }
            if not gdef["ranks"]:
                if (name in ("0", "default_pg", "WORLD") or gdef.get("desc") == "default_pg") and self.world:
                    gdef["ranks"] = list(range(self.world))
                else:
                    gdef["ranks"] = sorted(set(rs))
                    gdef["inferred"] = True
        return groups

    def members(self, g: Any) -> List[int]:
        """Global ranks of group ``g`` ([] when unknown)."""
        gd = self.groups.get(g)
        return list(gd["ranks"]) if gd and gd["ranks"] else []

    def gdesc(self, g: Any) -> str:
        """ "group 'g' (desc)" for evidence lines."""
        gd = self.groups.get(g) or {}
        d = "group '%s'" % g
        if gd.get("desc") and gd.get("desc") != g:
            d += " (%s)" % gd["desc"]
        return d

    def blocked(self, r: int) -> Record:
        """The record rank ``r`` waits in (only for waiting ranks)."""
        b = self.views[r].blocked
        assert b is not None, "rank %d is not blocked" % r
        return b

    def add(self, line: str) -> None:
        """Append an evidence line."""
        self.evidence.append(line)
