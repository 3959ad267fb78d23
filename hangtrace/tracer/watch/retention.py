"""Retention policy for run directories (issue 13): which runs to delete, and why. Pure.

The facts about each run directory (its size on disk, when it was last written, which of
its processes are alive) are gathered by ``tracer.watch.housekeeping``; this module turns
them into a ``Plan`` without touching the file system, so the policy is testable on
synthetic facts and ``hangtrace gc --dry-run`` prints exactly what a real run would do.

The policy: runs are ordered by last activity (newest first); while there are more than
``keep`` runs or they take more than ``max_bytes`` on disk, the oldest run that is not
protected is deleted. A run is protected when one of its processes (a traced process with
a ring, a watcher, a ``hangtrace run`` supervisor) is alive, when the liveness of one of
them cannot be checked from this host, or when it was written less than ``min_age_s`` ago
(a run whose first process has not created its ring yet, or that someone is reading).
Protected runs still count towards both limits: they occupy the disk.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

#: Bytes in one MiB: ``--max-mb`` and ``HANGTRACE_GC_MAX_MB`` count MiB (2**20 bytes), as
#: ``du -m`` does.
MIB = 1 << 20


@dataclass(frozen=True)
class Policy:
    """What to keep.

    Args:
        keep: number of newest runs kept (default 20; ``HANGTRACE_GC_KEEP``, ``--keep``).
        max_bytes: bytes on disk all runs together may take (default 2,000 MiB;
            ``HANGTRACE_GC_MAX_MB``, ``--max-mb``).
        min_age_s: a run written less than this many seconds ago is never deleted
            (default 300 s): it may be starting (no ring yet) or being read.
    """

    keep: int = 20
    max_bytes: int = 2000 * MIB
    min_age_s: float = 300.0


@dataclass(frozen=True)
class RunFacts:
    """One run directory as found on disk.

    Args:
        path: absolute path of the run directory.
        last_active_s: newest modification time (epoch seconds) of the directory and its
            top-level entries (ring files among them) but pid files.
        disk_bytes: bytes on disk (sum of ``st_blocks * 512``: ring files are sparse).
        apparent_bytes: sum of file sizes (``st_size``).
        live: one line per process of this run alive now ("rank 0 pid 123 on host").
        unknown: one line per process whose liveness cannot be checked from this host
            (a ring written on another host and not marked exited).
    """

    path: str
    last_active_s: float
    disk_bytes: int
    apparent_bytes: int
    live: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()


@dataclass(frozen=True)
class Decision:
    """Keep or delete one run, with the reason in words."""

    run: RunFacts
    delete: bool
    reason: str


@dataclass(frozen=True)
class Plan:
    """Decisions for every run found, newest run first."""

    policy: Policy
    decisions: tuple[Decision, ...]

    @property
    def to_delete(self) -> tuple[Decision, ...]:
        """Decisions to delete, oldest run first (the order the executor deletes them)."""
        return tuple(reversed([d for d in self.decisions if d.delete]))

    @property
    def kept(self) -> tuple[Decision, ...]:
        return tuple(d for d in self.decisions if not d.delete)

    @property
    def freed_bytes(self) -> int:
        """Bytes on disk the deletions free."""
        return sum(d.run.disk_bytes for d in self.decisions if d.delete)

    @property
    def kept_bytes(self) -> int:
        """Bytes on disk the kept runs take."""
        return sum(d.run.disk_bytes for d in self.decisions if not d.delete)


def protection(run: RunFacts, policy: Policy, now_s: float) -> str | None:
    """Why ``run`` must be kept whatever the limits say, or None when it may be deleted."""
    if run.live:
        more = " (+%d more)" % (len(run.live) - 1) if len(run.live) > 1 else ""
        return "alive: %s%s" % (run.live[0], more)
    if run.unknown:
        return "liveness unknown: %s" % run.unknown[0]
    age = now_s - run.last_active_s
    if age < policy.min_age_s:
        return "written %.0f s ago (< %.0f s)" % (max(age, 0.0), policy.min_age_s)
    return None


def plan(runs: Iterable[RunFacts], policy: Policy, now_s: float) -> Plan:
    """Decide, for every run, keep or delete under ``policy`` at time ``now_s`` (epoch s).

    Oldest unprotected runs are deleted while more than ``policy.keep`` runs remain or they
    take more than ``policy.max_bytes`` on disk. Returns a Plan (decisions newest first).
    Raises nothing.
    """
    ordered = sorted(runs, key=lambda r: (-r.last_active_s, r.path))
    count = len(ordered)
    total = sum(r.disk_bytes for r in ordered)
    out: list[Decision] = []
    for r in reversed(ordered):  # oldest first
        why = protection(r, policy, now_s)
        if why is not None:
            out.append(Decision(r, False, why))
        elif count > policy.keep:
            out.append(Decision(r, True, "more than %d runs" % policy.keep))
            count -= 1
            total -= r.disk_bytes
        elif total > policy.max_bytes:
            out.append(
                Decision(r, True, "runs take %.1f MiB > %.1f MiB" % (total / MIB, policy.max_bytes / MIB))
            )
            count -= 1
            total -= r.disk_bytes
        else:
            out.append(
                Decision(
                    r, False, "within the newest %d runs and %.0f MiB" % (policy.keep, policy.max_bytes / MIB)
                )
            )
    return Plan(policy, tuple(reversed(out)))
