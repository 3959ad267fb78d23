"""A clean shutdown is no death (pure): Snapshot in, the same Snapshot with the processes that
ended at the job's clean end recorded as exited 0, and one evidence line each, out.

Frameworks end their own workers without an exit record when a job ends well: Ray Train V2
(ray 2.60, blind job ``rt_clean``, 2026-12-07) has Ray's raylet SIGTERM or SIGKILL its worker
actors, its ``TrainController``, ``SynchronizationActor``, ``PreemptionWatcher`` and
``DatasetManager`` at the end of ``fit()``; ``ray.shutdown()`` SIGTERMs Ray's dashboard (exit
15). None of them failed: the driver exited 0 a second later. Before this module every clean
Ray Train run was "Failed Ray actor: PreemptionWatcher ... killed-without-record".

The job ended cleanly when its root process - the one that started first (the driver, the
launcher: its children start after it) - wrote its exit record with code 0. Then a process
that ended *quietly* - killed without an exit record or exited after a SIGTERM, with no
exception event, no fatal-signal dump, no phase open, no collective or p2p in flight and no
method that raised (stops - ``SystemExit`` - aside) - ended at that shutdown. The watcher's
twin is ``tracer/watch/shutdown.py`` (a quiet death waits for the root's exit).
"""

from __future__ import annotations

import dataclasses
from typing import List, Optional, Tuple

from hangtrace.tracer.analyze.failures.teardown import external_sender
from hangtrace.tracer.analyze.failures.causes import raised_phases
from hangtrace.tracer.snapshot import ProcessInfo, Snapshot


def root_process(snap: Snapshot) -> Optional[ProcessInfo]:
    """The job's root: the process that started first (``start_wall_ns``), None when none
    has a start time."""
    ps = [p for p in snap.processes if p.start_wall_ns]
    return min(ps, key=lambda p: (p.start_wall_ns, p.pid)) if ps else None


def ended_quietly(p: ProcessInfo) -> bool:
    """``p`` ended without a failure of its own (module docstring): killed with no record,
    or exited after a SIGTERM, idle, no exception, no crash, no method that raised."""
    sigs = p.signals or {}
    if p.state == "killed":
        pass
    elif not (p.state == "exited" and p.exit_code not in (0, None) and "sigterm" in sigs):
        return False
    return (
        "fatal" not in sigs
        and not (p.rank >= 0 and external_sender(sigs.get("sigterm")))
        and p.exception is None
        and p.phase is None
        and not p.inflight
        and not raised_phases(p)
    )


def cleaned(snap: Snapshot) -> Tuple[Snapshot, List[str]]:
    """``snap`` with each process that ended quietly at a clean job end recorded as exited 0
    (its exit time: the root's when it had none), and the evidence lines saying so; ``snap``
    itself, [] when the root did not exit 0."""
    root = root_process(snap)
    if root is None or root.state != "exited" or root.exit_code != 0:
        return snap, []
    out: List[ProcessInfo] = []
    lines: List[str] = []
    for p in snap.processes:
        if p is not root and ended_quietly(p):
            lines.append(
                "%s (%s%s) ended at the job's clean shutdown (root pid %d exited 0): %s, not a death"
                % (
                    p.key,
                    p.role.value if p.role is not None else "process",
                    " %s" % p.meta["ray_actor_class"] if (p.meta or {}).get("ray_actor_class") else "",
                    root.pid,
                    "no exit record" if p.state == "killed" else "SIGTERMed, exit %s" % p.exit_code,
                )
            )
            p = dataclasses.replace(
                p, state="exited", exit_code=0, exit_wall_ns=p.exit_wall_ns or root.exit_wall_ns
            )
        out.append(p)
    if not lines:
        return snap, []
    return dataclasses.replace(snap, processes=out), lines
