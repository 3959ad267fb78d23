"""Flight Recorder dumps joined into processes: ring-backed ones, or one per rank alone. Pure.

In: ``snapshot.ProcessInfo`` values read from rings and ``ring/frentries.FrDump`` dumps.
Out: a new list of ``ProcessInfo`` whose records are merged with the dumps' entries
(``ring/frrecords.merge_records``); ranks with a dump and no ring become FR-only processes.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from hangtrace.tracer.ring.frentries import FrDump
from hangtrace.tracer.ring.frrecords import FR_SOURCE, SLACK_NS, fr_records, merge_records
from hangtrace.tracer.ring.slotsummary import LazyRecords
from hangtrace.tracer.snapshot import ProcessInfo


def fr_groups(dump: FrDump) -> List[Dict[str, Any]]:
    """Group definitions (``ProcessInfo.groups`` shape) from pg_config and the entries."""
    out: Dict[str, Dict[str, Any]] = {}
    for name, g in dump.pg_config.items():
        if name:
            out[name] = {
                "name": name,
                "desc": g.desc or None,
                "ranks": list(g.ranks) if g.ranks else None,
                "member": True,
                "op": "flight-recorder",
            }
    for e in dump.entries:
        if e.group and e.group not in out:
            out[e.group] = {
                "name": e.group,
                "desc": e.group_desc or None,
                "ranks": None,
                "member": True,
                "op": "flight-recorder",
            }
    return list(out.values())


def _world_size(dumps: List[FrDump]) -> int:
    for d in dumps:
        if d.world_size > 0:
            return d.world_size
        for g in d.pg_config.values():
            if (g.name == "0" or g.desc == "default_pg") and g.ranks:
                return len(g.ranks)
    ranks = [d.rank for d in dumps if d.rank >= 0]
    return max(ranks) + 1 if ranks else -1


def fr_processes(dumps: Iterable[FrDump]) -> List[ProcessInfo]:
    """One ``ProcessInfo`` per rank from dumps alone (several dumps of one rank merged).

    ``pid`` is the dump's (our agent's files) or 0; ``state`` 'unknown' (a dump says
    nothing about liveness); ``world_size`` from the dumps' metadata or default group,
    else the highest rank + 1 (an undercount when the last ranks' files are missing).
    """
    dumps = list(dumps)
    world = _world_size(dumps)
    by_rank: Dict[int, List[FrDump]] = {}
    for d in dumps:
        by_rank.setdefault(d.rank, []).append(d)
    procs = []
    for rank in sorted(by_rank):
        ds = by_rank[rank]
        recs: List[Dict[str, Any]] = []
        groups: Dict[str, Dict[str, Any]] = {}
        for d in ds:
            recs.extend(fr_records(d))
            for g in fr_groups(d):
                if g["name"] not in groups or (g["ranks"] and not groups[g["name"]]["ranks"]):
                    groups[g["name"]] = g
        recs.sort(key=lambda r: (r["t_wall_ns"], r["idx"]))
        host = ds[0].host or "rank%d" % rank
        procs.append(
            ProcessInfo(
                host=host,
                pid=ds[0].pid,
                rank=rank,
                world_size=world,
                records=recs,
                groups=list(groups.values()),
                progress_wall_ns=max([r["t_wall_ns"] for r in recs if r["state"] == "completed"] or [0]),
                meta={"flight_recorder": [d.path for d in ds]},
            )
        )
    return procs


def _joined_inflight(
    inflight: Optional[Dict[str, Any]], merged: List[Dict[str, Any]]
) -> Optional[Dict[str, Any]]:
    """The ring's in-flight record as joined with the Flight Recorder (same ``idx``, our
    record): it takes torch's numbering like the rest of the stream. Left as ours, an
    in-flight ``broadcast_object_list`` (our seq 4, torch's 5 and 6) stood at a seq its
    peer had passed in torch's numbering: a false mismatch (blind Ray job
    ray_rollout_crash_trainer_waits)."""
    if not inflight or inflight.get("idx") is None:
        return inflight
    for r in merged:
        if r.get("idx") == inflight.get("idx") and r.get("source") != FR_SOURCE:
            return r
    return inflight


#: a process's records to join and where their window of newest records starts (``_window``)
Window = Tuple[List[Dict[str, Any]], Optional[float]]
#: ``_window`` of processes by their index in the list joined: made once, when ``cutoffs``
#: decides which entries of a dump to parse, and read again by ``join_fr``
Windows = Dict[int, Window]


def _matcher(procs: List[ProcessInfo]) -> Callable[[str, int, int], Optional[int]]:
    """The index in ``procs`` of the process a dump of (host, pid, rank) joins: by host and
    pid, else by rank (the last process of that rank); None when none."""
    by_pid = {(p.host, p.pid): i for i, p in enumerate(procs)}
    by_rank = {p.rank: i for i, p in enumerate(procs) if p.rank >= 0}

    def find(host: str, pid: int, rank: int) -> Optional[int]:
        i = by_pid.get((host, pid)) if pid else None
        return i if i is not None else (by_rank.get(rank) if rank >= 0 else None)

    return find


def _window_of(procs: List[ProcessInfo], i: int, windows: Windows) -> Window:
    """``_window(procs[i])``, made once per index in ``windows``."""
    got = windows.get(i)
    if got is None:
        got = windows[i] = _window(procs[i])
    return got


def _window(p: ProcessInfo) -> Window:
    """The records of ``p`` to join with its dump and where their window of newest records
    starts (wall ns; None: they are every record). A process read from its ring summary
    (``records`` = the summary's subset) joins that subset and the summary's tail (its
    newest records, decoded here only): what the analysis reads of it, instead of every
    record of every rank (issue 40: 4,096 ranks with dumps decoded ~8 M records)."""
    s = p.summary
    recs = list(p.records or ())
    if s is None or not s.tail or len(recs) >= s.count:
        return recs, None
    # the history too (the newest 512 collective/phase/step records, further back than the
    # tail's 256 records of every kind): joined from the tail alone, the summary rebuilt from
    # the merged records kept only the history the tail held - 21 steps of a 60-step gloo job
    # with a memory sampler (its dump named no straggler; step 20 was gone), a DDP job's
    # C++-issued all-reduces only as far back as the tail
    history = [r for r in s.history if r.get("t_wall_ns")]
    by_idx: Dict[Any, Any] = {r.get("idx"): r for r in recs}
    first = _consecutive_from(s.tail)
    if first is None:
        tail = list(s.tail)
        for r in tail + history:
            by_idx.setdefault(r.get("idx"), r)
    else:
        for r in history:
            by_idx.setdefault(r.get("idx"), r)
        tail = _tail_records(s.tail, first, by_idx)
    merged = sorted(by_idx.values(), key=lambda r: r.get("idx") or 0)
    if len(merged) >= s.count:
        return merged, None
    return merged, float(min((r.get("t_wall_ns") or 0) for r in tail + history))


def _consecutive_from(tail: Sequence[Any]) -> Optional[int]:
    """The first ring index of ``tail`` when it is a ring's raw tail (``LazyRecords``, decoded
    on access) whose indices run without a gap (its records' indices increase: the reader
    orders the valid slots by index), else None (a tail of dicts, or torn slots left out)."""
    n = len(tail)
    if not isinstance(tail, LazyRecords) or not n:
        return None
    first, last = tail[0].get("idx"), tail[-1].get("idx")
    if type(first) is not int or type(last) is not int or first < 1 or last - first != n - 1:
        return None
    return first


def _tail_records(tail: Sequence[Any], first: int, by_idx: Dict[Any, Any]) -> List[Any]:
    """The records of ``tail`` (ring indices ``first``, ``first + 1``, ...: ``_consecutive_from``),
    each taken from ``by_idx`` when it holds that index (the same slot, decoded already: the
    summary's records and the history cover most of a tail), else decoded and added to it
    (issue 40: decoding every rank's whole tail again was a third of the window's cost)."""
    out = []
    for i in range(len(tail)):
        r = by_idx.get(first + i)
        if r is None:
            r = by_idx[first + i] = tail[i]
        out.append(r)
    return out


def window_cutoff(p: ProcessInfo, window: Optional[Window] = None) -> Optional[int]:
    """The wall time (ns) from which ``p``'s dump entries can join its window of records
    (``_window``): its window's start and its earliest collective record, less the
    pairing tolerance; None when every entry may be needed (its records are all there, or
    one has no wall time). Entries before it join only as a group's newest, its highest seq
    or a failure (``collect/frentryparse.select_raw``). ``window``: ``_window(p)`` when made."""
    ours, since = window if window is not None else _window(p)
    if since is None:
        return None
    times = [int(r.get("t_wall_ns") or 0) for r in ours if r.get("kind") == "collective"]
    if not all(times):
        return None
    return int(min([since, *times])) - 2 * SLACK_NS


def cutoffs(procs: List[ProcessInfo], windows: Windows) -> Callable[[str, int, int], Optional[int]]:
    """``window_cutoff`` of the process a dump of (host, pid, rank) joins (``join_fr``'s
    pairing, ``_matcher``); None for a dump that joins none. The windows made are kept in
    ``windows`` for ``join_fr`` of the same ``procs``."""
    find = _matcher(procs)

    def cutoff_for(host: str, pid: int, rank: int) -> Optional[int]:
        i = find(host, pid, rank)
        return None if i is None else window_cutoff(procs[i], _window_of(procs, i, windows))

    return cutoff_for


def _ring_collective_groups(p: ProcessInfo) -> Set[str]:
    """Groups in which ``p``'s own ring records number collectives (our Python-call count)."""
    return {
        str(r.get("group"))
        for r in p.records or ()
        if r.get("kind") == "collective" and r.get("seq") is not None and r.get("source") is None
    }


def _dumpless_groups(procs: List[ProcessInfo], pairs: List[Tuple[int, FrDump]]) -> Set[str]:
    """Groups in which a rank-holding process with no dump (``pairs``: (index in ``procs``,
    its dump)) numbers collectives in our count."""
    dumped = {i for i, _ in pairs}
    ours: Set[str] = set()
    for i, p in enumerate(procs):
        if i not in dumped and p.rank >= 0:
            ours |= _ring_collective_groups(p)
    return ours


def unalignable_groups(
    procs: List[ProcessInfo],
    pairs: List[Tuple[int, FrDump]],
    fr_of: Optional[List[List[Dict[str, Any]]]] = None,
    windows: Optional[Windows] = None,
) -> Set[str]:
    """Groups whose collectives cannot be numbered one way across ranks: some rank's dump
    has entries no call of ours launched there (torch's count runs ahead of ours: DDP's C++
    all-reduce, issue 38), while a rank with no dump (dead before it could answer) has
    records there in our count only. Joined, the two counts meet at numbers that are not the
    same collective: a rank-0-only metric all_reduce (ours: seq 1; torch's: 14) stood
    against its peers' first DDP all_gather (torch's 1), a false mismatch in the snapshot
    that caught the peers' dumps and none in those that did not. ``pairs``: (index in
    ``procs``, its dump); ``fr_of``: ``fr_records`` of each pair's dump, in the order of ``pairs``, when the caller has them."""
    ours = _dumpless_groups(procs, pairs)
    out: Set[str] = set()
    for k, (i, d) in enumerate(pairs if ours else ()):
        recs, since = _window_of(procs, i, {} if windows is None else windows)
        fr = [
            r for r in (fr_of[k] if fr_of is not None else fr_records(d)) if str(r.get("group")) in ours - out
        ]
        if fr:
            merged = merge_records(recs, fr, since_ns=since)
            out |= {str(r.get("group")) for r in merged if r.get("source") == FR_SOURCE}
    return out


def join_fr(
    procs: List[ProcessInfo], dumps: Iterable[FrDump], windows: Optional[Windows] = None
) -> List[ProcessInfo]:
    """Join dumps into ring-backed processes (by host+pid, else by rank); dumps of ranks
    without a ring become FR-only processes. Returns the new list of processes (new
    ProcessInfo values for the joined ones; their summary is recomputed from the merged
    records). A group the counts cannot align in (:func:`unalignable_groups`) keeps our
    records alone: its dumps' entries are left out. ``windows``: those ``cutoffs`` made
    for the same ``procs``."""
    out = list(procs)
    windows = {} if windows is None else windows
    find = _matcher(out)
    alone = []
    pairs: List[Tuple[int, FrDump]] = []
    for d in dumps:
        i = find(d.host, d.pid, d.rank)
        if i is None:
            alone.append(d)
        else:
            pairs.append((i, d))
    # each dump's entries as records once; all at once only when the alignment check needs
    # them, else one dump at a time, each dropped once joined (issue 40: every rank's records
    # alive together were most of the peak memory)
    fr_of = [fr_records(d) for _, d in pairs] if _dumpless_groups(out, pairs) else None
    skip = unalignable_groups(out, pairs, fr_of, windows) if fr_of is not None else set()
    pairs.reverse()
    if fr_of is not None:
        fr_of.reverse()
    while pairs:
        i, d = pairs.pop()
        fr = fr_of.pop() if fr_of is not None else fr_records(d)
        p = out[i]
        known = {g.get("name") for g in p.groups}
        meta = dict(p.meta)
        meta["flight_recorder"] = list(meta.get("flight_recorder") or []) + [d.path]
        ours, since = _window_of(procs, i, windows)
        if skip:
            fr = [r for r in fr if str(r.get("group")) not in skip]
        merged = merge_records(ours, fr, since_ns=since)
        out[i] = dataclasses.replace(
            p,
            records=merged,
            summary=None,
            meta=meta,
            inflight=_joined_inflight(p.inflight, merged),
            groups=list(p.groups) + [g for g in fr_groups(d) if g["name"] not in known],
        )
    return out + fr_processes(alone)
