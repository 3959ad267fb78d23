"""Timeline building blocks: options, the aligned clock, track identities, the event types,
the verdict's mark and where a process's track ends (pure).

Times in the ring are per-process pairs ``(t_mono_ns, t_wall_ns)`` taken together by the
recorder. ``CLOCK_MONOTONIC`` is one clock per host (shared by every process there, never
stepped by NTP), so a host's offset ``wall - mono`` is estimated once as the median over
every record of every process on that host, and a record is placed at
``t_mono_ns + offset(host)``. Hosts are aligned by their wall clocks (NTP/PTP): the
offset carries each host onto the Unix epoch. Times that exist only as wall time
(faulthandler file mtimes, snapshot time) are used as they are.

Trace times are microseconds (Chrome trace-event format, ``ts``/``dur``) since ``t0_ns``,
the earliest time in the trace.
"""

import math
from dataclasses import dataclass, field
from statistics import median
from typing import Any, Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple

from hangtrace.tracer.process_model import ProcessRoles, assign_roles
from hangtrace.tracer.snapshot import ProcessInfo, Role

#: Default event budget: a trace of about this many events (≈ 210 bytes each in JSON,
#: so ≈ 33 MB; 1.4 MB gzipped) still opens in the Perfetto UI in a browser tab.
DEFAULT_MAX_EVENTS = 200_000


@dataclass(frozen=True)
class TimelineOptions:
    """What goes into a timeline.

    Args:
        ranks: only these global ranks (and their helper processes); None = all.
        since_s / until_s: time window in seconds from the first record of the run; a
            negative value counts back from the last one (``since_s=-30``: the last 30 s).
        max_events: event budget; above it each process keeps only its newest records
            (plus its in-flight and failed ones) and memory samples are thinned. The trace
            says so in ``otherData.sampling``.
        flows: draw flow arrows between the ranks' slices of one (group, seq).

    Raises:
        ValueError: ``since_s`` or ``until_s`` not finite (NaN, infinity).
    """

    ranks: Optional[FrozenSet[int]] = None
    since_s: Optional[float] = None
    until_s: Optional[float] = None
    max_events: int = DEFAULT_MAX_EVENTS
    flows: bool = True

    def __post_init__(self) -> None:
        """Raises ValueError naming ``since_s``/``until_s`` when one is not a finite number."""
        for name in ("since_s", "until_s"):
            v = getattr(self, name)
            if v is not None and not math.isfinite(v):
                raise ValueError("TimelineOptions.%s must be a finite number of seconds, got %r" % (name, v))


@dataclass(frozen=True)
class Clock:
    """Maps a host's monotonic ns, or wall ns, to trace microseconds since ``t0_ns``.

    ``offsets``: {host: wall_ns - mono_ns} (median over that host's records).
    """

    offsets: Dict[str, int]
    t0_ns: int

    def mono_us(self, host: str, mono_ns: int) -> float:
        """Trace µs of a monotonic time (ns) taken on ``host``."""
        return round((mono_ns + self.offsets.get(host, 0) - self.t0_ns) / 1000.0, 3)

    def wall_us(self, wall_ns: int) -> float:
        """Trace µs of a wall time (ns since the Unix epoch)."""
        return round((wall_ns - self.t0_ns) / 1000.0, 3)

    def mono_to_wall(self, host: str, mono_ns: int) -> int:
        """Wall ns of a monotonic ns on ``host``."""
        return mono_ns + self.offsets.get(host, 0)


def host_offsets(procs: Iterable[ProcessInfo], per_proc: int = 64) -> Dict[str, int]:
    """{host: median(t_wall_ns - t_mono_ns)} over up to ``per_proc`` records per process
    (evenly spread), plus each durable event's own pair. Hosts without records get none
    (records from torch's Flight Recorder alone have no monotonic reading: ``frclock``)."""
    pairs: Dict[str, List[int]] = {}
    for p in procs:
        recs = p.records
        stride = max(1, len(recs) // per_proc)
        out = pairs.setdefault(p.host, [])
        for r in recs[::stride]:
            if r.get("t_wall_ns") and r.get("t_mono_ns"):
                out.append(r["t_wall_ns"] - r["t_mono_ns"])
        for e in p.events or ():
            if isinstance(e.get("wall_ns"), int) and isinstance(e.get("mono_ns"), int):
                out.append(e["wall_ns"] - e["mono_ns"])
    return {h: int(median(v)) for h, v in pairs.items() if v}


@dataclass(frozen=True)
class Track:
    """One process track of the trace (a rank, or a process without a rank).

    ``tid_base``: thread ids of this track are ``tid_base + k`` (globally unique).
    ``members``: the traced processes shown on it (``"host:pid"``), the rank's own
    process first, then its helper processes (DataLoader workers, ...). ``rank``: the
    first member's rank (or rank hint); ``holds_rank``: that process IS the rank
    (``process_model``), not a helper, launcher or leftover that inherited RANK.
    """

    pid: int
    name: str
    rank: int
    members: Tuple[str, ...]
    labels: Tuple[str, ...] = ()
    holds_rank: bool = True

    @property
    def tid_base(self) -> int:
        return self.pid * 1000


def process_label(p: ProcessInfo, role: Optional[Role] = None, helper_of: Optional[int] = None) -> str:
    """``rank 1 · vm:22375 · trainer-1`` (rank, host:pid, Ray actor name or class); a process
    that holds no rank is named by its role: ``helper of rank 1 · vm:22380``,
    ``launcher · vm:22300``, ``rank 1 (another process holds it) · vm:22310``, ``no rank ·
    vm:22301``."""
    if role in (None, Role.RANK, Role.RAY_ACTOR) and p.rank >= 0:
        who = "rank %d" % p.rank
    elif role == Role.RANK_HELPER and helper_of is not None:
        who = "helper of rank %d" % helper_of
    elif role in (Role.LAUNCHER, Role.RAY_TASK_WORKER):
        who = role.value
    elif p.rank >= 0:  # an earlier generation of a restarted rank, a leftover with its RANK
        who = "rank %d (another process holds it)" % p.rank
    else:
        who = "no rank"
    parts = [who, "%s:%d" % (p.host, p.pid)]
    meta = p.meta or {}
    actor = meta.get("ray_actor_name") or meta.get("ray_actor_class")
    if actor:
        parts.append(str(actor))
    return " · ".join(parts)


def _owners(procs: Sequence[ProcessInfo], roles: ProcessRoles) -> Dict[str, ProcessInfo]:
    """{helper key: the rank process whose track shows it}: a rank helper (DataLoader worker,
    any child of a rank, with or without the RANK it inherited) goes under the process that
    holds its rank, when that process is in ``procs``."""
    keys = {p.key for p in procs}
    owner: Dict[str, ProcessInfo] = {}
    for p in procs:
        of = roles.helper_of.get(p.key)
        holder = roles.ranks.get(of) if of is not None and roles.role(p) == Role.RANK_HELPER else None
        if holder is not None and holder.key in keys and holder.key != p.key:
            owner[p.key] = holder
    return owner


def assign_tracks(
    procs: Sequence[ProcessInfo],
    culprit_ranks: Sequence[int] = (),
    culprit_actors: Sequence[str] = (),
    straggler: Optional[int] = None,
) -> Tuple[List[Track], Dict[str, Track]]:
    """One track per rank (its helpers grouped under it), one per other process.

    Which process IS rank r, and which are its helpers, is the process model's
    (``process_model.assign_roles``): torch DataLoader workers and other children inherit
    RANK without joining a group (DESIGN.md "a rank is a process that joined a group").
    Returns the tracks in display order and {"host:pid": track}. Only a process that holds
    a culprit rank, or a culprit Ray actor, has its track named ``CULPRIT …``: a helper never. The track of rank
    ``straggler`` (issue 43: the rank every recent step waits for) gets `` · straggler`` after
    its label and the label ``straggler``.
    """
    roles = assign_roles(procs)
    holders = {p.key for p in roles.ranks.values()}
    owner = _owners(procs, roles)
    order = sorted(
        (p for p in procs if p.key not in owner),
        key=lambda p: (p.key not in holders, p.rank < 0, p.rank, p.host, p.pid),
    )
    tracks: List[Track] = []
    by_key: Dict[str, Track] = {}
    cr, ca = set(culprit_ranks), set(culprit_actors)
    helpers_of: Dict[str, List[str]] = {}
    for h in procs:
        if h.key in owner:
            helpers_of.setdefault(owner[h.key].key, []).append(h.key)
    for i, p in enumerate(order):
        helpers = tuple(helpers_of.get(p.key, ()))
        role = roles.role(p)
        name = process_label(p, role, roles.helper_of.get(p.key))
        meta = p.meta or {}
        culprit = (p.key in holders and p.rank in cr) or (
            role == Role.RAY_ACTOR
            and bool(ca)
            and (meta.get("ray_actor_name") in ca or meta.get("ray_actor_id") in ca)
        )
        labels: Tuple[str, ...] = ()
        if culprit:
            name = "CULPRIT " + name
            labels = ("culprit",)
        if straggler is not None and p.rank == straggler:
            name += " · straggler"
            labels += ("straggler",)
        if helpers:
            name += " (+%d helper process%s)" % (len(helpers), "" if len(helpers) == 1 else "es")
        t = Track(
            pid=i + 1,
            name=name,
            rank=p.rank,
            members=(p.key,) + helpers,
            labels=labels,
            holds_rank=p.key in holders,
        )
        tracks.append(t)
        for k in t.members:
            by_key[k] = t
    return tracks, by_key


def straggler_of(
    procs: Sequence[ProcessInfo], diagnosis: Optional[Dict[str, Any]]
) -> Optional[Dict[str, Any]]:
    """The straggler (``details['straggler']``) of the stored verdict; without a stored verdict,
    the straggler analysis of the processes' records (``analyze/straggler``); None when nobody
    is slow or it cannot be told."""
    if diagnosis is not None:
        st = (diagnosis.get("details") or {}).get("straggler")
        return st if isinstance(st, dict) and isinstance(st.get("rank"), int) else None
    try:
        from hangtrace.tracer.analyze.straggler import of_processes

        found = of_processes({p.rank: p for p in sorted(procs, key=lambda p: p.start_wall_ns) if p.rank >= 0})
    except Exception:
        return None
    return found.details() if found is not None else None


@dataclass
class Threads:
    """Thread ids of one track, allocated on first use; ``names`` {tid: name}."""

    base: int
    names: Dict[int, str] = field(default_factory=dict)
    _ids: Dict[str, int] = field(default_factory=dict)

    def tid(self, name: str) -> int:
        """Thread id for the thread track called ``name`` (created on first use)."""
        t = self._ids.get(name)
        if t is None:
            t = self.base + len(self._ids) + 1
            self._ids[name] = t
            self.names[t] = name
        return t


# --- a process's events: their types, the verdict's mark, where its track ends ---
Event = Dict[str, Any]

#: flow key -> list of (ts µs, pid, tid, rank)
FlowRefs = Dict[Tuple[Any, ...], List[Tuple[float, int, int, int]]]


@dataclass(frozen=True)
class Mark:
    """The collective a verdict is about: ``(group, seq)`` on ``ranks``, and the verdict kind."""

    kind: str
    ranks: Tuple[int, ...]
    group: Optional[str]
    seq: Optional[int]


def last_record_mono(p: ProcessInfo) -> Optional[int]:
    """Newest monotonic ns in the process's records (issue or completion), or None."""
    best = None
    for r in p.records:
        for t in (r.get("t_mono_ns"), r.get("t_end_mono_ns")):
            if t and (best is None or t > best):
                best = t
    return best


def end_wall_ns(p: ProcessInfo, clock: Clock, taken_wall_ns: int) -> int:
    """Wall ns at which this process's track ends: its last record when it was killed, its
    exit time when it exited, the snapshot time (``taken_wall_ns``) when alive (``events``)."""
    last = last_record_mono(p)
    last_wall = clock.mono_to_wall(p.host, last) if last else p.start_wall_ns
    if p.state == "killed":
        return last_wall
    if p.state == "exited":
        return max(last_wall, p.exit_wall_ns or 0)
    return max(last_wall, taken_wall_ns or 0)
