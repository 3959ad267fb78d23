"""A rank restarted alone: its peers kept the process group it died in. (pure)

A Ray actor with ``max_restarts`` (or any supervisor that restarts one worker) gets a new
process for a rank that died, while the other ranks keep theirs: the new process calls
``init_process_group`` again and waits for a rendezvous its peers never join (their group
still holds the dead process; gloo and NCCL groups are fixed at creation), and its peers'
collective failed with a transport error. Blind helper 73: trainer 1 of 2 SIGKILLed at step
5, restarted by Ray; the restarted actor hung in ``ProcessGroupGloo(`` in its ``__init__``
while trainer 0, alive, served the driver's calls. Analysing the newest process for the
rank (what a restart of the whole job needs: ``torchrun --max-restarts``) lost the death
and blamed the replacement.

In: the process model's choice per rank and its restart claims. Out: per such rank, the
process that died (analysed as the rank: its death is the root) and its replacement
(described by ``analyze/failures/replacement.py``, ``details['replacement']``).

A restart is *alone* when (a) the newest earlier process of the rank died (killed, or
exited with a non-zero code), (b) another rank's analysed process started before that
process's last sign of life (the two ran in one generation) and before the replacement,
and (c) the replacement never completed a collective or p2p (it did not rejoin). A
restart of the whole job fails (b): every rank's analysed process is of the new
generation.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, Mapping, Tuple

from hangtrace.tracer.snapshot import ProcessInfo


def _last_sign_of_life(p: ProcessInfo) -> int:
    sm = p.summary
    last = (sm.last.get("t_wall_ns") or 0) if sm is not None and sm.last is not None else 0
    return max(last, p.progress_wall_ns or 0, p.exit_wall_ns or 0)


def _rejoined(p: ProcessInfo) -> bool:
    sm = p.summary
    if sm is None:
        return False
    recs: Iterable[Any] = (*sm.by_group.values(), *sm.by_peer.values())
    return any(isinstance(r, Mapping) and r.get("state") == "completed" for r in recs)


def lone_restarts(
    ranks: Mapping[int, ProcessInfo],
    claims: Iterable[Tuple[int, str, str, Tuple[str, ...]]],
    procs: Iterable[ProcessInfo],
) -> Dict[int, Tuple[ProcessInfo, ProcessInfo]]:
    """rank -> (the process that died, its replacement) for every restart claim
    ``(rank, 'restart', kept key, earlier keys)`` that restarted the rank alone (module
    docstring); ``ranks``: the analysed process per rank (the replacement for these)."""
    by_key = {p.key: p for p in procs}
    out: Dict[int, Tuple[ProcessInfo, ProcessInfo]] = {}
    for r, kind, kept_key, others in claims:
        new = ranks.get(r)
        earlier = [by_key[k] for k in others if k in by_key]
        if kind != "restart" or new is None or new.key != kept_key or not earlier:
            continue
        prev = max(earlier, key=lambda p: p.start_wall_ns or 0)
        alive_until = _last_sign_of_life(prev)
        if not prev.died or _rejoined(new) or not alive_until:
            continue
        if any(
            q is not new
            and (q.start_wall_ns or 0)
            and (q.start_wall_ns or 0) < alive_until
            and (q.start_wall_ns or 0) < (new.start_wall_ns or 0)
            for rr, q in ranks.items()
            if rr != r
        ):
            out[r] = (prev, new)
    return out
