"""The process model: which traced process IS rank r, and what every other process is.

RANK in a process's environment is only a hint. DataLoader workers (forked from a rank),
multiprocessing's resource tracker (started after a launcher set RANK in its own
environment), compile workers and any child of a rank inherit it without being ranks
(DESIGN.md, "Helper processes inherit the environment"). A process *is* rank r once it
joined a process group as r: the ring header's ``rank_source`` says so (written by the
torch.distributed hooks at ``init_process_group``, docs/FORMAT.md), and a ring that
recorded group definitions joined one too (rings written before that header field).

Rules, in order (:func:`assign_roles`):

1. Ray actors are ``ray-actor`` (they may also hold a rank); Ray workers without an actor
   are ``ray-task-worker``; the Ray driver is a ``launcher``.
2. Rank r is held by the processes that joined as r, or that called ``init_process_group``
   asking for r and are still in its rendezvous. One such process: it is rank r.
   Several: when the older ones are dead, that is a restart (torchelastic, a Ray actor
   restart): the newest holds the rank and the restart is noted; otherwise two processes
   joined (or asked to join) as r at the same time, a ``conflict`` (the newest is analysed,
   the conflict is reported). A process that descends from another live one that joined
   as r (a rank's child that inherited its RANK and MASTER_PORT) never holds r: the
   ancestor does, and the claim is ``inherited``.
3. A rank no process joined as (rendezvous not reached, or rings from before joining)
   is held by a candidate with that rank hint: alive before dead, then the one with no
   traced ancestor holding the same hint, then the earliest started.
4. A process with a traced ancestor that holds a rank is a ``rank-helper`` of that rank:
   listed under it in reports, never standing for it.
5. A traced process that is the parent of ranks (torchrun's agent, the parent of
   ``torch.multiprocessing.spawn``, even with a RANK of its own) is a ``launcher``; a
   child of a launcher that is no rank (multiprocessing's resource tracker, which
   inherits the RANK a spawn parent set) is ``other``.
6. Every other process with a rank hint is a ``rank-helper`` of that rank; the rest are
   ``other``.
"""

from __future__ import annotations

import re

from dataclasses import dataclass, field, replace
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from hangtrace.tracer.ring.layout import RANK_FROM_GROUP, RANK_FROM_JOIN
from hangtrace.tracer.snapshot import ProcessInfo, Role


@dataclass(frozen=True)
class RankClaim:
    """Several processes for one rank: ``kept`` is analysed, ``others`` are listed.

    ``kind``: 'restart' (the others had died before ``kept`` started), 'conflict' (two
    processes joined as one rank in one generation) or 'inherited' (the others are
    descendants of ``kept`` that joined as its rank with the environment they inherited)."""

    rank: int
    kind: str
    kept: str
    others: Tuple[str, ...]


@dataclass(frozen=True)
class ProcessRoles:
    """Result of :func:`assign_roles`. Keys are ``ProcessInfo.key`` ('host:pid')."""

    ranks: Mapping[int, ProcessInfo]
    roles: Mapping[str, Role]
    #: helper key -> the rank it belongs to (by rank hint or by ancestry)
    helper_of: Mapping[str, int]
    claims: Tuple[RankClaim, ...] = field(default=())

    def role(self, p: ProcessInfo) -> Role:
        return self.roles.get(p.key, Role.OTHER)


def joined(p: ProcessInfo) -> bool:
    """True when ``p`` joined a process group (its rank is the group's, not a hint)."""
    meta = p.meta or {}
    if meta.get("rank_source") == RANK_FROM_GROUP:
        return True
    return bool(p.groups) and p.rank is not None and p.rank >= 0


def requested(p: ProcessInfo) -> bool:
    """True when ``p`` called ``init_process_group`` asking for its rank and has not
    joined yet (it is inside the rendezvous): the rank it asked for, not an inherited hint."""
    return (p.meta or {}).get("rank_source") == RANK_FROM_JOIN


def ray_role(p: ProcessInfo) -> Optional[Role]:
    """RAY_ACTOR, RAY_TASK_WORKER or LAUNCHER (the Ray driver) from the ring meta, else None."""
    meta = p.meta or {}
    if meta.get("ray_actor_id") or meta.get("ray_actor_class"):
        return Role.RAY_ACTOR
    if not (meta.get("ray_job_id") or meta.get("ray_worker_id") or meta.get("ray_pid")):
        return None
    argv = process_argv(p)
    if any("default_worker.py" in a or a.startswith("ray::") for a in argv):
        return Role.RAY_TASK_WORKER
    if argv and _RAY_OWN.search(argv[0].replace("\\", "/")):
        return (
            Role.OTHER
        )  # Ray's own daemons (dashboard, its agent, log monitor, autoscaler monitor): not the driver
    return Role.LAUNCHER


#: a script of Ray's own package (``sys.argv[0]`` of its daemons: ``.../ray/dashboard/dashboard.py``,
#: ``.../ray/_private/log_monitor.py``, ``.../ray/autoscaler/_private/monitor.py``, ...)
_RAY_OWN = re.compile(r"(site|dist)-packages/ray/")


def process_argv(p: ProcessInfo) -> List[str]:
    """The process's command line from its start record ([] when unknown)."""
    for e in p.events or ():
        if isinstance(e, dict) and e.get("event") == "start":
            return [str(a) for a in (e.get("argv") or ())]
    return []


def parent_pid(p: ProcessInfo) -> int:
    """The parent pid ``p`` recorded (ring meta, else its start record); 0 when unknown."""
    meta = p.meta or {}
    v = meta.get("ppid")
    if v is None:
        for e in p.events or ():
            if isinstance(e, dict) and e.get("event") == "start":
                v = e.get("ppid")
                break
    try:
        return int(v) if v is not None else 0
    except (TypeError, ValueError):
        return 0


def _dead(p: ProcessInfo) -> bool:
    return p.state in ("killed", "exited")


def _descendants(
    cands: Sequence[ProcessInfo], by_pid: Mapping[Tuple[str, int], ProcessInfo]
) -> List[ProcessInfo]:
    """The candidates that descend from another live candidate: a rank's child (an eval
    script started with ``subprocess.run``) that inherited RANK, WORLD_SIZE and MASTER_PORT
    and joined, or asked to join, the job's process group as the same rank (blind helper 66)."""
    keys = {p.key for p in cands if not _dead(p)}
    out = []
    for p in cands:
        cur = by_pid.get((p.host, parent_pid(p)))
        for _ in range(64):
            if cur is None:
                break
            if cur.key in keys and cur.key != p.key:
                out.append(p)
                break
            cur = by_pid.get((cur.host, parent_pid(cur)))
    return out


def _pick_joined(
    rank: int, cands: Sequence[ProcessInfo], by_pid: Optional[Mapping[Tuple[str, int], ProcessInfo]] = None
) -> Tuple[ProcessInfo, Optional[RankClaim]]:
    kids = _descendants(cands, by_pid) if by_pid is not None and len(cands) > 1 else []
    if kids and len(kids) < len(cands):
        kept, claim = _pick_joined(rank, [p for p in cands if p not in kids])
        others = tuple(p.key for p in kids) + (claim.others if claim is not None else ())
        return kept, RankClaim(rank, "inherited" if claim is None else claim.kind, kept.key, others)
    cands = sorted(cands, key=lambda p: p.start_wall_ns or 0)
    kept = cands[-1]
    if len(cands) == 1:
        return kept, None
    older = cands[:-1]
    # a dead process's end time is only a lower bound after a SIGKILL: every older one
    # being dead is what makes a restart; two live processes are a conflict, and so are a
    # dead one and the newer one it outlived the start of (both claimed the rank at once: a
    # launcher that gave RANK twice, one of them failing to bind the store)
    restart = all(
        _dead(p) and not (p.exit_wall_ns and p.exit_wall_ns > (kept.start_wall_ns or 0)) for p in older
    )
    return kept, RankClaim(rank, "restart" if restart else "conflict", kept.key, tuple(p.key for p in older))


def _pick_hinted(cands: Sequence[ProcessInfo], by_pid: Mapping[Tuple[str, int], ProcessInfo]) -> ProcessInfo:
    rank = cands[0].rank

    def has_hinted_ancestor(p: ProcessInfo) -> bool:
        seen = 0
        cur = by_pid.get((p.host, parent_pid(p)))
        while cur is not None and seen < 64:
            if cur.rank == rank:
                return True
            cur = by_pid.get((cur.host, parent_pid(cur)))
            seen += 1
        return False

    return min(cands, key=lambda p: (_dead(p), has_hinted_ancestor(p), p.start_wall_ns or 0))


def _ancestor_rank(
    p: ProcessInfo, by_pid: Mapping[Tuple[str, int], ProcessInfo], rank_of: Mapping[str, int]
) -> Optional[int]:
    cur = by_pid.get((p.host, parent_pid(p)))
    for _ in range(64):
        if cur is None:
            return None
        if cur.key in rank_of:
            return rank_of[cur.key]
        cur = by_pid.get((cur.host, parent_pid(cur)))
    return None


def _is_rank(r: Optional[int]) -> bool:
    return r is not None and r >= 0


def assign_roles(
    processes: Iterable[ProcessInfo], valid_rank: Callable[[Optional[int]], bool] = _is_rank
) -> ProcessRoles:
    """Assign a :class:`Role` to every process and choose the process of each rank.

    ``valid_rank(rank) -> bool`` filters implausible header ranks (the caller's bounds).
    Pure; linear in the number of processes (ancestor walks are bounded by 64 levels).
    """
    procs = list(processes)
    by_pid: Dict[Tuple[str, int], ProcessInfo] = {(p.host, p.pid): p for p in procs}
    roles: Dict[str, Role] = {}
    joined_by_rank: Dict[int, List[ProcessInfo]] = {}
    hinted_by_rank: Dict[int, List[ProcessInfo]] = {}
    for p in procs:
        ray = ray_role(p)
        if ray is not None:
            roles[p.key] = ray
        if not valid_rank(p.rank):
            continue
        (joined_by_rank if joined(p) or requested(p) else hinted_by_rank).setdefault(p.rank, []).append(p)
    ranks, claims = _choose_ranks(joined_by_rank, hinted_by_rank, by_pid)
    rank_of = {p.key: r for r, p in ranks.items()}
    for r, cands in joined_by_rank.items():  # older generations of a restarted rank
        for p in cands:
            if (
                p.key not in rank_of and _ancestor_rank(p, by_pid, rank_of) is None
            ):  # (a rank's child: its helper)
                roles.setdefault(p.key, Role.OTHER)
    helper_of: Dict[str, int] = {}
    parents = {(p.host, parent_pid(p)) for p in ranks.values()}
    for p in procs:
        if p.key in rank_of:
            roles.setdefault(p.key, Role.RANK)
            continue
        if p.key in roles:
            continue
        role, of = _other_role(p, by_pid, rank_of, parents, ranks, valid_rank)
        if of is not None:
            helper_of[p.key] = of
        roles[p.key] = role
    return ProcessRoles(ranks=ranks, roles=roles, helper_of=helper_of, claims=tuple(claims))


def _choose_ranks(
    joined_by_rank: Mapping[int, Sequence[ProcessInfo]],
    hinted_by_rank: Mapping[int, Sequence[ProcessInfo]],
    by_pid: Mapping[Tuple[str, int], ProcessInfo],
) -> Tuple[Dict[int, ProcessInfo], List[RankClaim]]:
    """The process of each rank (rules 2 and 3) from the candidates that joined (or asked
    to) and those with only a hint; returns ({rank: process}, the claims noted on the way)."""
    ranks: Dict[int, ProcessInfo] = {}
    claims: List[RankClaim] = []
    for r, cands in joined_by_rank.items():
        kept, claim = _pick_joined(r, cands, by_pid)
        ranks[r] = kept
        if claim is not None:
            claims.append(claim)
    for r, cands in hinted_by_rank.items():
        if r not in ranks:
            kept = ranks[r] = _pick_hinted(cands, by_pid)
            gone = tuple(
                p.key
                for p in cands
                if p is not kept and _dead(p) and (p.start_wall_ns or 0) <= (kept.start_wall_ns or 0)
            )
            if gone:  # an earlier generation that never joined a group
                claims.append(RankClaim(r, "restart", kept.key, gone))
    return ranks, claims


def _other_role(
    p: ProcessInfo,
    by_pid: Mapping[Tuple[str, int], ProcessInfo],
    rank_of: Mapping[str, int],
    parents: Set[Tuple[str, int]],
    ranks: Mapping[int, ProcessInfo],
    valid_rank: Callable[[Optional[int]], bool],
) -> Tuple[Role, Optional[int]]:
    """The role of ``p``, a process that holds no rank and has no Ray role (rules 4 to 6),
    and the rank it is a helper of (None when it is no helper)."""
    anc = _ancestor_rank(p, by_pid, rank_of)
    if anc is not None:
        return Role.RANK_HELPER, anc
    if (p.host, p.pid) in parents:  # (before its rank hint: a spawn parent that set RANK)
        return Role.LAUNCHER, None
    if parent_pid(p) > 0 and (p.host, parent_pid(p)) in parents:  # a launcher's child: its resource tracker
        return Role.OTHER, None
    if valid_rank(p.rank) and p.rank in ranks:
        return Role.RANK_HELPER, p.rank
    return Role.OTHER, None


def name_senders(procs: Sequence[ProcessInfo]) -> List[ProcessInfo]:
    """``procs`` with each SIGTERM sender that had exited when its signal was handled
    ("python (exited)": the C handler reads ``/proc/<pid>/cmdline``, gone with a sender that
    exits right after ``kill``) named by the command line it recorded, when it was a traced
    process of the run on the same host alive at that time: "node_agent.py 5121 10.0
    (exited)" (blind helper 95's node agent). Other processes are returned unchanged."""
    by_pid = {(q.host, q.pid): q for q in procs}
    out = []
    for p in procs:
        sig = (p.signals or {}).get("sigterm") or {}
        snd = sig.get("sender") or {}
        q = by_pid.get((p.host, int(snd.get("pid") or 0)))
        t = int(sig.get("wall_ns") or 0)
        argv = (
            process_argv(q)
            if q is not None
            and str(snd.get("cmdline") or "").endswith(("(exited)", "(gone)"))
            and q.start_wall_ns <= t
            and (not q.exit_wall_ns or t <= q.exit_wall_ns + 2_000_000_000)
            else []
        )
        if argv:
            named = dict(sig, sender=dict(snd, cmdline="%s (exited)" % " ".join(argv)))
            p = replace(p, signals=dict(p.signals, sigterm=named))
        out.append(p)
    return out
