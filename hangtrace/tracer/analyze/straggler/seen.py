"""Since when, when the rings no longer hold the start: what the node watcher saw. Pure.

In: the straggler found in the snapshot's rings (rank, group, its first slow step or None,
the oldest step compared) and ``Snapshot.stragglers_seen`` (``tracer/stragglerseen.py``: the
watcher's episodes, each with the first slow step its window found while it still held the
start). Out: :class:`Since` - the first slow step and where it comes from, or the step it
was slow before.

The rules:

1. the rings' own change point wins (``since_source`` 'rings') - unless the episode of rule 2
   was first seen at an earlier step (the rank was slow then: a change point after it, as
   a noisy stretch inside the window, is not the start);
2. else the newest watcher episode of the same rank and group that had begun at the time of
   the snapshot's newest record and had not ended before it (the watcher ends an episode
   only after two checks without it: one that ended earlier is another episode) gives its
   first slow step (``since_source`` 'watcher', with the time it was first seen) - when
   that step is not inside the rings' window by more than :data:`when.MIN_BEFORE` steps
   (there, the rings saw no start: they and the watcher disagree, and the rings' records
   are the newer word);
3. else "since before step N": the older of the rings' oldest step and the oldest step of
   the watcher's first window that named it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from hangtrace.tracer.analyze.straggler.when import MIN_BEFORE
from hangtrace.tracer.stragglerseen import SeenStraggler


@dataclass(frozen=True)
class Since:
    """``since_step``: the first slow step (None: unknown); ``source``: 'rings' | 'watcher' |
    None; ``before_step``: when unknown, the step it was slow before (None: no step known);
    ``first_seen_wall_ns``/``first_seen_step``: the watcher's first sighting of this episode
    (wall ns, the newest step then), None without one."""

    since_step: Optional[int]
    source: Optional[str]
    before_step: Optional[int]
    first_seen_wall_ns: Optional[int] = None
    first_seen_step: Optional[int] = None


def episode(seen: Sequence[SeenStraggler], rank: int, group: str, at_wall_ns: int) -> Optional[SeenStraggler]:
    """The watcher's episode of ``rank`` in ``group`` under way at ``at_wall_ns`` (rule 2), or None."""
    found = [
        e
        for e in seen
        if e.rank == rank
        and e.group == group
        and (at_wall_ns <= 0 or e.first_seen_wall_ns <= at_wall_ns)
        and (e.ended_wall_ns is None or at_wall_ns <= 0 or e.ended_wall_ns >= at_wall_ns)
    ]
    return max(found, key=lambda e: e.first_seen_wall_ns) if found else None


def resolve(
    rank: int,
    group: str,
    since_step: Optional[int],
    oldest_step: Optional[int],
    seen: Sequence[SeenStraggler],
    at_wall_ns: int,
) -> Since:
    """The module docstring's rules. ``at_wall_ns``: the time of the snapshot's newest record
    (0: unknown, every episode matches)."""
    e = episode(seen, rank, group, at_wall_ns)
    first = (e.first_seen_wall_ns, e.first_seen_step) if e is not None else (None, None)
    if since_step is not None and (first[1] is None or since_step <= first[1]):
        return Since(since_step, "rings", None, *first)
    if e is not None and e.since_step is not None:
        if oldest_step is None or e.since_step < oldest_step + MIN_BEFORE:
            return Since(e.since_step, "watcher", None, *first)
    bounds = [s for s in (oldest_step, e.before_step if e is not None else None) if s is not None]
    return Since(None, None, min(bounds) if bounds else None, *first)


def episode_at(seen: Sequence[SeenStraggler], at_wall_ns: int) -> Optional[SeenStraggler]:
    """The newest watcher episode of any rank under way at ``at_wall_ns`` (rule 2's times), or None."""
    found = [
        e
        for e in seen
        if e.first_seen_wall_ns <= at_wall_ns and (e.ended_wall_ns is None or e.ended_wall_ns >= at_wall_ns)
    ]
    return max(found, key=lambda e: e.first_seen_wall_ns) if found else None
