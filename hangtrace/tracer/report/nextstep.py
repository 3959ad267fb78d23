"""The "Next:" advice of a verdict (pure): a ``Diagnosis`` in, the advice text of
``advice`` that fits what its analysis found (``details``) out, or None. Split from
``advice.py``, which keeps the texts."""

from typing import Any, Callable, Dict, List, Optional, Tuple

from hangtrace.tracer.diagnosis import Cause, Diagnosis, Kind, blocked_on
from hangtrace.tracer.report.advice import (
    ACTOR_STUCK_NEXT,
    ASYNC_BLOCKING_NEXT,
    AT_EXIT_COLLECTIVE_NEXT,
    BEFORE_RENDEZVOUS_NEXT,
    BROKEN_ORDER_NEXT,
    BUSY_NEXT,
    CHILD_NEXT,
    CHILD_PIPE_NEXT,
    CHILD_RANK_NEXT,
    DEAD_NEXT,
    DEPARTED_NEXT,
    EXIT_CODE_NEXT,
    EXIT_NEXT,
    EXIT_NEXTS,
    GROUP_ORDER_NEXT,
    HELPER_CRASH_NEXT,
    HELPER_KILLED_NEXT,
    HELPER_OOM_NEXT,
    LOADER_WAIT_NEXT,
    LOCK_NEXT,
    NODE_LOST_NEXT,
    NEXT,
    P2P_PEER_NEXT,
    PDB_NEXT,
    POLL_CYCLE_NEXT,
    POLL_NEXT,
    PREEMPTED_NEXT,
    RANKLESS_DEATH_NEXT,
    RENDEZVOUS_LOCK_NEXT,
    RENDEZVOUS_NEXT,
    RESTART_ALONE_NEXT,
    SELF_CALL_NEXT,
    SLEEP_NEXT,
    STACKS_NEXT,
    TASK_EXCEPTION_NEXT,
    THREADS_NEXT,
    THREAD_EXCEPTION_NEXT,
    peer_next,
)


_STUCK, _UNKNOWN, _MISMATCH, _ACTORS = (
    Kind.STUCK_OUTSIDE_COLLECTIVE,
    Kind.UNKNOWN,
    Kind.COLLECTIVE_MISMATCH,
    Kind.ACTOR_DEADLOCK,
)


def self_call(d: Dict[str, Any]) -> bool:
    """Is the actor cycle of ``d`` one actor waiting on its own method (rules/actor_waits.py)?"""
    cyc = list(d.get("actor_cycle") or [])
    return len(cyc) == 1 and cyc[0].get("waits_on") == cyc[0].get("actor")


#: The advice of a diagnosis by what its analysis found, first match wins: (kind, test of
#: (diagnosis, details), advice text or a function of (diagnosis, details) giving it).
def _straggler_next(g: Diagnosis, d: Dict[str, Any]) -> str:
    st = d.get("straggler") or {}
    return (
        "look at what rank %s does%s that the others do not: its host's load and CPU throttling, its data "
        "loader, its GPU clocks (`hangtrace timeline RUN_DIR` marks its track)"
        % (st.get("rank"), " in phase '%s'" % st["phase"] if st.get("phase") else "")
    )


def _node_lost_next(diag: Diagnosis, d: Dict[str, Any]) -> str:
    lost = ((d.get("nodes") or {}).get("lost")) or [{}]
    return NODE_LOST_NEXT % ", ".join(
        "node %s (%s)" % (n.get("node_rank"), n.get("host") or "host unknown") for n in lost
    )


_CASES: List[Tuple[Kind, Callable[[Diagnosis, Dict[str, Any]], Any], Any]] = [
    (Kind.DEAD_RANK, lambda g, d: (d.get("nodes") or {}).get("lost"), _node_lost_next),  # issue 39
    (Kind.PROGRESSING, lambda g, d: d.get("straggler"), _straggler_next),  # analyze/straggler/
    (_UNKNOWN, lambda g, d: d.get("rankless_death"), RANKLESS_DEATH_NEXT),
    (
        Kind.CROSS_GROUP_DEADLOCK,
        lambda g, d: d.get("broken_order"),
        BROKEN_ORDER_NEXT,
    ),  # analyze/graph/grouporder.py
    (_MISMATCH, lambda g, d: d.get("group_order"), GROUP_ORDER_NEXT),  # analyze/graph/groupdefs.py
    (
        Kind.SKIPPED_COLLECTIVE,
        lambda g, d: d.get("minority_at_exit"),
        AT_EXIT_COLLECTIVE_NEXT,
    ),  # rules/minority.py
    (
        Kind.SKIPPED_COLLECTIVE,
        lambda g, d: d.get("departed"),  # analyze/failures/departures.py
        lambda g, d: PREEMPTED_NEXT if (d.get("departed") or {}).get("sigterm") else DEPARTED_NEXT,
    ),
    (
        Kind.SKIPPED_COLLECTIVE,
        lambda g, d: d.get("returned"),  # analyze/actors/actorreturn.py: an actor method returned
        lambda g, d: PREEMPTED_NEXT if (d.get("returned") or {}).get("sigterm") else DEPARTED_NEXT,
    ),
    (
        Kind.DEAD_RANK,
        lambda g, d: d.get("actor_lives_on") is not None,
        TASK_EXCEPTION_NEXT,
    ),  # rules/actors.py
    (_UNKNOWN, lambda g, d: str(g.cause) == Cause.STALLED_IN_RENDEZVOUS.value, RENDEZVOUS_NEXT),
    (
        _STUCK,
        lambda g, d: d.get("rendezvous_ranks"),
        lambda g, d: RENDEZVOUS_LOCK_NEXT if d.get("rendezvous_lock") else BEFORE_RENDEZVOUS_NEXT,
    ),
    (_STUCK, lambda g, d: d.get("exit_wait"), lambda g, d: EXIT_NEXTS.get(str(d.get("exit_how")), EXIT_NEXT)),
    (_STUCK, lambda g, d: str(g.cause) == Cause.BUSY.value, BUSY_NEXT),
    (_STUCK, lambda g, d: d.get("after_exception_source") == "asyncio-task", TASK_EXCEPTION_NEXT),
    (_STUCK, lambda g, d: d.get("after_exception_source") == "thread", THREAD_EXCEPTION_NEXT),
    (_STUCK, lambda g, d: d.get("child_inherited_rank"), CHILD_RANK_NEXT),
    (
        _STUCK,
        lambda g, d: d.get("child_pipe_full"),
        CHILD_PIPE_NEXT,
    ),  # analyze/stuck/childwait.py: the pipe deadlock
    (_STUCK, lambda g, d: d.get("child_wait"), CHILD_NEXT),
    (
        _STUCK,
        lambda g, d: d.get("peer_wait"),
        lambda g, d: peer_next(str(d.get("peer_role")), bool(g.culprit_actors and not g.culprit_ranks)),
    ),
    (_STUCK, lambda g, d: d.get("lock_wait"), LOCK_NEXT),
    (_MISMATCH, lambda g, d: len((d.get("group_threads") or {}).get("threads") or ()) > 1, THREADS_NEXT),
    (_MISMATCH, lambda g, d: d.get("p2p_pair"), P2P_PEER_NEXT),
    (_MISMATCH, lambda g, d: d.get("skipped_call"), lambda g, d: NEXT[Kind.SKIPPED_COLLECTIVE]),
    (
        _MISMATCH,
        lambda g, d: (d.get("size_abort") or {}).get("call") is not None,  # analyze/graph/sizeabort.py
        lambda g, d: NEXT[Kind.SKIPPED_COLLECTIVE],
    ),
    (
        _MISMATCH,
        lambda g, d: d.get("changed_by_history"),  # analyze/graph/history.py
        lambda g, d: (
            DEPARTED_NEXT
            if (d.get("changed_by_history") or {}).get("left_loop")
            else NEXT[Kind.SKIPPED_COLLECTIVE]
        ),
    ),
    (_ACTORS, lambda g, d: self_call(d), SELF_CALL_NEXT),
    (
        _ACTORS,
        lambda g, d: any(x.get("blocks_loop") for x in d.get("actor_cycle") or ()),
        ASYNC_BLOCKING_NEXT,
    ),
    (
        _STUCK,
        lambda g, d: d.get("poll_wait"),
        lambda g, d: POLL_CYCLE_NEXT if d.get("poll_cycle") else POLL_NEXT,
    ),
    (
        _STUCK,
        lambda g, d: (
            g.culprit_ranks
            and all(
                (blocked_on(str(x)) or str(x)).startswith("asleep in ")
                for x in (d.get("culprit_reasons") or {"": ""}).values()
            )
        ),
        SLEEP_NEXT,
    ),
    (_STUCK, lambda g, d: g.culprit_actors and not g.culprit_ranks, ACTOR_STUCK_NEXT),
    (_UNKNOWN, lambda g, d: d.get("loader_wait"), LOADER_WAIT_NEXT),  # analyze/stuck/loaderwait.py
    (
        _UNKNOWN,
        lambda g, d: g.stack_classes and str(g.cause) == Cause.STALLED_OUTSIDE_COLLECTIVES.value,
        STACKS_NEXT,
    ),
]


def next_step(diag: Diagnosis) -> Optional[str]:
    """The "Next:" advice of ``diag`` (no trailing period), or None: the first of ``_CASES``
    that fits, else the kind's (``NEXT``) or, for a dead rank, its cause's (``DEAD_NEXT``)."""
    k = diag.kind
    d = diag.details or {}
    for kind, test, advice in _CASES:
        if k == kind and test(diag, d):
            return advice(diag, d) if callable(advice) else str(advice)
    if k != Kind.DEAD_RANK:
        return NEXT.get(k)
    cause = str(diag.cause) if diag.cause is not None else ""
    nxt = DEAD_NEXT.get(cause)
    att = ((diag.details or {}).get("memory") or {}).get("attribution") or {}
    kills = [(a or {}).get("helper_kill") for a in att.values()]
    if cause == Cause.EXCEPTION.value and ("oom" in kills or "not-oom" in kills or "fatal" in kills):
        # a DataLoader worker of the rank OOM-killed, SIGKILLed from outside, or crashed (analyze/memory/attribution.py)
        nxt = (
            HELPER_OOM_NEXT
            if "oom" in kills
            else HELPER_KILLED_NEXT
            if "not-oom" in kills
            else HELPER_CRASH_NEXT
        )
    if cause == Cause.EXCEPTION.value and str((diag.details or {}).get("cause_text") or "").startswith(
        "BdbQuit"
    ):
        nxt = PDB_NEXT
    if nxt is None and cause.startswith("exit-code"):
        nxt = EXIT_CODE_NEXT
    if (diag.details or {}).get("replacement"):  # analyze/failures/lonerestart.py
        nxt = "%s; then %s" % (nxt, RESTART_ALONE_NEXT) if nxt else RESTART_ALONE_NEXT
    if nxt is not None and diag.culprit_actors and not diag.culprit_ranks:
        # a Ray actor without a rank is the culprit: the advice speaks of it, not of a rank
        nxt = (
            nxt.replace("that rank's", "that actor's")
            .replace("that rank", "that actor")
            .replace("the rank", "the actor")
        )
    return nxt
