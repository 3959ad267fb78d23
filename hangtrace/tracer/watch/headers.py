"""What a ring header says a process is, for the watcher: starting, a pooled worker that
never worked, a rank, a helper of a rank. Pure functions of ``reader.read_header`` dicts."""

from __future__ import annotations

from typing import Any, Dict, FrozenSet, Mapping, Tuple

from hangtrace.tracer.ring import layout as F

Header = Dict[str, Any]  # a ring header (``reader.read_header``), plus "phase" (its name or None)


def starting(
    h: Mapping[str, Any],
    joined_ranks: FrozenSet[int] = frozenset(),
    working_ranks: FrozenSet[int] = frozenset(),
) -> bool:
    """A process that may still become a rank, with no progress since its ring was created
    (the recorder counts 1 at creation): still importing or in rendezvous, not hung
    (HANGTRACE_STARTUP_STALL_S). Not starting: a process whose rank hint (RANK in its
    environment) is already held by a process that joined a group as that rank - it is a
    helper of that rank (DataLoader worker, resource tracker), and helpers never hold the
    start-up grace open (issue 9). Nor a process that joined as rank r while another live
    process that joined as r has worked (``working_ranks``): a second claimant, such as a
    rank's child that inherited its RANK and MASTER_PORT (blind helper 66: an eval script
    started with subprocess.run), while the job's own rank r is past its start."""
    rank = h.get("rank", -1)
    if rank < 0 or h["progress_count"] > 1 or h["phase_strid"]:
        return False
    if h.get("rank_source", 0) == F.RANK_FROM_GROUP:
        return rank not in working_ranks
    return rank not in joined_ranks


def never_worked(h: Mapping[str, Any]) -> bool:
    """A process with no rank hint, no phase and no progress since its ring was created
    (the recorder counts 1 at creation): a pooled worker waiting for work, such as Ray's
    idle workers, which Ray starts and retires every few seconds. Its ring appearing is
    not progress of the job (else the churn holds a stall off for ever) and its being
    killed without a fatal-signal dump is not an incident (else every retired worker is a
    death snapshot; a crash before any work still is: its dump is there); both were
    seen on the blind Ray job ray2_reward_crash_ddp (issue 9). Once it does anything - a
    phase, a record, a rank - it is watched like every process."""
    return h.get("rank", -1) < 0 and h["progress_count"] <= 1 and not h["phase_strid"]


def at_startup(headers: Mapping[str, Mapping[str, Any]]) -> bool:
    """The run is starting: no process of ``headers`` (those gone included) has joined a
    process group yet, and one names a rank (from its environment, or asking for one in
    init_process_group) or none has worked (``never_worked``: only launchers, still
    importing). Then a process that has not worked yet, busy on CPU, is the start going on
    (``busy.py``): Lightning's ``python job.py`` importing for 60 s at load 15-25 before it
    spawns rank 1, rank 1 importing while rank 0 waits in the rendezvous (issue 37)."""
    if not headers or any(h.get("rank_source", 0) == F.RANK_FROM_GROUP for h in headers.values()):
        return False
    named = any(h.get("rank") is not None and h.get("rank", -1) >= 0 for h in headers.values())
    return named or all(map(never_worked, headers.values()))


def is_rank(h: Mapping[str, Any]) -> bool:
    return (
        h.get("rank", -1) is not None
        and h.get("rank", -1) >= 0
        and h.get("rank_source", 0) in (F.RANK_FROM_GROUP, F.RANK_FROM_JOIN)
    )


def who(h: Mapping[str, Any], parents: Mapping[Tuple[Any, Any], Mapping[str, Any]] = {}) -> str:
    """'rank 3' for a process that joined a group as 3 or is in init_process_group asking to
    be 3; 'a helper of rank 3 (a child: DataLoader worker, ...)' for a child of such a rank
    (``parents``: headers by (host, pid)); a rank in the environment alone is a hint (a spawn
    parent's children inherit it): 'a process with RANK=3'."""
    r = h.get("rank", -1)
    if is_rank(h):
        return "rank %d" % r
    parent = parents.get((h.get("host"), h.get("ppid")))
    if parent is not None and is_rank(parent):
        return "a helper of rank %d (its child: a DataLoader worker or the like)" % parent["rank"]
    if r is None or r < 0:
        return "a process without a rank"
    return "a process with RANK=%d" % r


def ranks_ended(headers: Mapping[str, Mapping[str, Any]]) -> bool:
    """Every process that joined a group as a rank has recorded its exit (finalizing or
    gone), and there was at least one: what is still alive is the job's end - launchers
    reaping (torchrun's agent notices its workers' exit on its monitor interval, 17 s at
    load 130 on 2 cores here), interpreters finalizing. The watcher gives that end the
    start-up threshold, as it gives the start (no distributed wait is left to explain)."""
    ranks = [h for h in headers.values() if is_rank(h)]
    return bool(ranks) and all(h["state"] == F.ST_EXITED for h in ranks)
