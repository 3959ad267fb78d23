"""Hang versus death: which finding is the verdict, as a decision table (pure).

The first failure by time is the root; the first incident's verdict stands: stopping a
hung job afterwards is cascade, not a new root. ``TABLE`` lists the rows in order; the
first row whose condition holds gives the outcome:

====  ===========================================================  ============
row   condition                                                    outcome
====  ===========================================================  ============
0     a rank-less Ray actor failed (``rules/rankless_root.py``:    RANKLESS
      no rank progressed after it, before the ranks stalled),
      before the root death if any, and no hang was found or the
      hang's culprits all wait outside collectives or are dead
      (the ranks may be waiting for the actor, not each other)
0b    no hang was found, and the first failure is a rank that     TIMEOUT
      gave up waiting in a collective while ranks it waited for
      were outside collectives (``rules/timeout_waiter.py``)
1     a root death exists and no hang was found                    DEATH
2     root death; the hang is a chain whose end at the root's     DEATH
      rank is itself classified dead
3     root death; the hang's start time is unknown                 DEATH
4     root death; the root did not provably live on after the     DEATH
      hang began (``afterhang.death_after``: an exception of its
      own raised later, with no step of its own since, counts
      as not living on - it died on its way to the collective)
5     root death; the root is a hang culprit and died within      DEATH
      ``DIED_INTO_HANG_NS`` of the hang's start (died *into* it)
6     root death, otherwise (it died after the hang had begun,    HANG
      e.g. the user SIGTERMed a hung job): listed as cascade
7     no root death, a hang                                        HANG
8     no root death, no hang, failed records                       TRANSPORT
9     otherwise                                                    IDLE
====  ===========================================================  ============

Before the table: when no hang was found but every rank died at about the same time long
after its last progress (``deaths.stopped_after_stall``), the job was stopped because it
hung: the deaths are marked victims and the wait-for graph is rebuilt; if that finds a
hang, it is the verdict (the deaths become cascade), else the deaths stand.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Callable, Optional, Tuple

from hangtrace.tracer.analyze.context import Ctx
from hangtrace.tracer.analyze.failures.afterhang import death_after, died_soon_after
from hangtrace.tracer.analyze.rules.base import Finding
from hangtrace.tracer.analyze.rules.rankless_root import ranks_wait_on_outside
from hangtrace.tracer.diagnosis import Kind


class Outcome(Enum):
    """Which finding becomes the verdict."""

    DEATH = "death"  #: the root death (rule dead_rank)
    HANG = "hang"  #: the hang finding (the first hang rule that found)
    TRANSPORT = "transport"  #: the first failed record (rule transport)
    RANKLESS = "rankless"  #: a Ray actor without a rank failed first (rule rankless_root)
    TIMEOUT = "timeout"  #: a rank timed out waiting for ranks outside collectives (rule timeout_waiter)
    IDLE = "idle"  #: nobody is waiting for anyone broken (rule idle)


@dataclass(frozen=True)
class Situation:
    """The arbiter's input: the first hang finding (or None), the root death finding (or
    None), whether any failure (dead rank, failed record) exists, and the rank-less
    candidate root (rule rankless_root, or None)."""

    hang: Optional[Finding]
    death: Optional[Finding]
    any_failure: bool
    rankless: Optional[Finding] = None
    timeout: Optional[Finding] = None


def _rankless_first(s: Situation) -> bool:
    r = s.rankless
    if r is None or (s.death is not None and s.death.start and not r.start < s.death.start):
        return False
    return s.hang is None or ranks_wait_on_outside(s.hang)


def _root_is_dead_chain_end(s: Situation) -> bool:
    assert s.hang is not None and s.death is not None
    return s.hang.end_kinds.get(s.death.culprits[0]) == Kind.DEAD_RANK.value


def _died_into_hang(ctx: Ctx, s: Situation) -> bool:
    assert s.hang is not None and s.death is not None
    root = s.death.data[0]
    return root.rank in s.hang.culprits and died_soon_after(root, s.hang.start)


@dataclass(frozen=True)
class Row:
    """One row of the decision table: ``when(ctx, situation)`` -> ``outcome``."""

    name: str
    when: Callable[[Ctx, Situation], bool]
    outcome: Outcome


TABLE: Tuple[Row, ...] = (
    Row("rank-less actor failed first", lambda c, s: _rankless_first(s), Outcome.RANKLESS),
    Row(
        "timed out waiting for ranks outside collectives",
        lambda c, s: s.timeout is not None and s.hang is None,
        Outcome.TIMEOUT,
    ),
    Row("death, no hang", lambda c, s: s.death is not None and s.hang is None, Outcome.DEATH),
    Row(
        "death is a dead chain end",
        lambda c, s: s.death is not None and _root_is_dead_chain_end(s),
        Outcome.DEATH,
    ),
    Row(
        "hang start unknown",
        lambda c, s: s.death is not None and not (s.hang and s.hang.start),
        Outcome.DEATH,
    ),
    Row(
        "death not after the hang began",
        lambda c, s: (
            s.death is not None and s.hang is not None and not death_after(s.death.data[0], s.hang.start)
        ),
        Outcome.DEATH,
    ),
    Row(
        "culprit died into the hang",
        lambda c, s: s.death is not None and _died_into_hang(c, s),
        Outcome.DEATH,
    ),
    Row("death after the hang began", lambda c, s: s.death is not None, Outcome.HANG),
    Row("hang", lambda c, s: s.hang is not None, Outcome.HANG),
    Row("failed records", lambda c, s: s.any_failure, Outcome.TRANSPORT),
    Row("otherwise", lambda c, s: True, Outcome.IDLE),
)


def decide(ctx: Ctx, situation: Situation) -> Row:
    """The first row of ``TABLE`` whose condition holds."""
    for row in TABLE:
        if row.when(ctx, situation):
            return row
    raise AssertionError("the last row of TABLE always holds")
