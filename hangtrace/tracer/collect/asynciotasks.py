"""The pending asyncio tasks the Flight Recorder agents wrote (``hooks/process/asyncio_tasks.py``,
``fr/<host>-<pid>.tasks.json``; docs/FORMAT.md), joined into a snapshot's processes as
``ProcessInfo.asyncio_loops`` (issue 9, item 2). Impure (reads files); never raises:
an unreadable file adds a line to ``errors``.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
from typing import Any, Dict, List, Tuple

from hangtrace.tracer.snapshot import LoopTasks, PendingTask, Snapshot

_NAME = re.compile(r"^(.+)-(\d+)\.tasks\.json$")


def _task(t: Dict[str, Any]) -> PendingTask:
    got = t.get("awaits")
    aw: Dict[str, Any] = got if isinstance(got, dict) else {}
    frames = tuple(
        (str(f.get("func")), str(f.get("file")), int(f.get("line") or 0))
        for f in t.get("frames") or ()
        if isinstance(f, dict)
    )
    return PendingTask(
        name=str(t.get("name")),
        coro=str(t.get("coro")),
        frames=frames,
        awaits_task=aw.get("task"),
        awaits_future=aw.get("future"),
    )


def parse(data: Any) -> Tuple[LoopTasks, ...]:
    """The loops of one tasks file's JSON."""
    wall = int(data.get("wall_ns") or 0)
    return tuple(
        LoopTasks(
            thread_id=lp.get("thread_id"),
            wall_ns=wall,
            tasks=tuple(_task(t) for t in lp.get("tasks") or () if isinstance(t, dict)),
        )
        for lp in data.get("loops") or ()
        if isinstance(lp, dict)
    )


def load(fr_dir: str, errors: List[str]) -> Dict[Tuple[str, int], Tuple[LoopTasks, ...]]:
    """``{(host, pid): loops}`` of every tasks file in ``fr_dir``."""
    out: Dict[Tuple[str, int], Tuple[LoopTasks, ...]] = {}
    for path in sorted(glob.glob(os.path.join(fr_dir, "*.tasks.json"))):
        m = _NAME.match(os.path.basename(path))
        if not m:
            continue
        try:
            with open(path, "rb") as f:
                out[(m.group(1), int(m.group(2)))] = parse(json.loads(f.read()))
        except (OSError, ValueError, TypeError, AttributeError) as e:
            errors.append("%s: unreadable asyncio tasks (%s); analysed without them" % (path, e))
    return out


def with_tasks(snap_dir: str, snap: Snapshot) -> Snapshot:
    """``snap`` with the tasks files of ``snap_dir/fr`` joined to their processes."""
    errors: List[str] = []
    found = load(os.path.join(snap_dir, "fr"), errors)
    if not found and not errors:
        return snap
    procs = [
        dataclasses.replace(p, asyncio_loops=found[(p.host, p.pid)]) if (p.host, p.pid) in found else p
        for p in snap.processes
    ]
    return dataclasses.replace(snap, processes=procs, errors=list(snap.errors) + errors)
