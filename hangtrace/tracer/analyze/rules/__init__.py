"""The verdict rules, one per module, in precedence order (docs/ARCHITECTURE.md,
"Analysis"; "how to add a verdict rule").

``HANG_RULES``: tried in order over the wait-for graph; the first that finds is *the
hang*. ``DEATH_RULE`` finds the root death. The arbiter (``analyze/arbiter.py``) decides
between them; with neither, ``FALLBACK_RULES`` are tried in order (``idle`` always
finds). ``STACK_ONLY`` replaces all of them for stacks-only snapshots (attach);
``ACTORS`` is the verdict when no traced process has a rank (Ray actors only): its
failures first, then ``ACTOR_RULES`` in order (the wait-for graph across actor calls, an
actor that can never be scheduled), then its stuck actors. ``RANKLESS_ROOT`` finds a
rank-less Ray actor that failed beside the ranks (the arbiter weighs it against the hang
and the root death); ``TIMEOUT_WAITER`` the ranks outside collectives that a rank which
gave up waiting in a collective (a timeout, the first failure) waited for.
"""

from typing import Dict, Tuple

from hangtrace.tracer.analyze.rules import (
    actor_waits,
    actors,
    before_rendezvous,
    broken_order,
    chain,
    dead_rank,
    deadlock,
    diverged,
    exit_wait,
    extra_collective,
    idle,
    left_phase,
    minority,
    mismatch,
    no_record_file,
    rankless_root,
    rendezvous,
    silent_mismatch,
    stack_only,
    timeout_waiter,
    transport,
    unschedulable,
)
from hangtrace.tracer.analyze.rules.base import Finding, Rule

HANG_RULES: Tuple[Rule, ...] = (
    mismatch,  # 'collective-mismatch' / mismatch: signatures differ at one seq (definitive)
    extra_collective,  # 'skipped-collective' / extra-collective: a cycle explained by one extra collective
    left_phase,  # 'skipped-collective' / skipped: a cycle explained by a side that left the phase without it
    broken_order,  # 'skipped-collective' / skipped: a cycle explained by a minority that broke the groups' order
    deadlock,  # 'cross-group-deadlock' / cycle
    no_record_file,  # 'unknown' / no-record-file: only ranks without a file are waited for
    diverged,  # 'collective-mismatch' / sequence-diverged
    minority,  # 'skipped-collective' / extra-collective: the waiting minority diverged
    rendezvous,  # 'skipped-collective' / extra-collective: a new collective against a Ray actor rendezvous
    chain,  # dead-rank / skipped-collective / stuck-outside-collective: the chain ends
)
DEATH_RULE: Rule = dead_rank  # 'dead-rank': the earliest non-victim death
FALLBACK_RULES: Tuple[Rule, ...] = (
    silent_mismatch,  # 'collective-mismatch' / mismatch: completed records disagree (gloo ran on)
    transport,  # 'transport-error': failed records, nobody dead, nobody hung
    before_rendezvous,  # 'stuck-outside-collective': ranks blocked before init_process_group, others inside it
    exit_wait,  # 'stuck-outside-collective': a rank's program returned, its exit waits (a thread, a handler)
    idle,  # 'progressing' / 'unknown' stalled-*: always finds
)
STACK_ONLY: Rule = stack_only  # attach: stacks only, every kind from stacks
ACTORS: Rule = actors  # no rank at all: Ray actors without a rank (dead-rank / stuck, culprit_actors)
ACTOR_RULES: Tuple[Rule, ...] = (
    actor_waits,  # 'actor-deadlock': a cycle of waits on actor calls; or the actor a chain ends at
    unschedulable,  # 'unschedulable-actor': waited on, no process, asks more than any node has
)
RANKLESS_ROOT: Rule = rankless_root  # 'dead-rank' naming a rank-less actor beside ranks (the arbiter decides)
TIMEOUT_WAITER: Rule = (
    timeout_waiter  # 'stuck-outside-collective': the ranks a timed-out rank waited for (arbiter)
)

ALL_RULES: Tuple[Rule, ...] = (
    HANG_RULES
    + (DEATH_RULE,)
    + FALLBACK_RULES
    + (STACK_ONLY, ACTORS)
    + ACTOR_RULES
    + (RANKLESS_ROOT, TIMEOUT_WAITER)
)
BY_NAME: Dict[str, Rule] = {r.NAME: r for r in ALL_RULES}

__all__ = [
    "HANG_RULES",
    "DEATH_RULE",
    "FALLBACK_RULES",
    "STACK_ONLY",
    "ACTORS",
    "ACTOR_RULES",
    "RANKLESS_ROOT",
    "TIMEOUT_WAITER",
    "ALL_RULES",
    "BY_NAME",
    "Finding",
    "Rule",
]
