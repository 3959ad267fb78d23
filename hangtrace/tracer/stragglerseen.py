"""The stragglers a node watcher saw, as it saw them (issue 43): the file contract between the
watcher (``watch/stragglerwatch.py`` writes) and the analysis (``collect`` reads it into
``Snapshot.stragglers_seen``; ``analyze/straggler`` uses it when its own window cannot see
the start of a slowdown).

Why: the analysis finds the first slow step in each rank's ring summary history (the newest
512 collective/phase/step records: 10-40 steps of a real job), so a slowdown older than that
has no start in ``dump``/``analyze``. The watcher checks every few seconds from the job's
start, so it sees the start while it is still recorded, and remembers it here.

File: ``RUN_DIR/stragglers-<host>.json`` (one per node watcher; a run on one node has one),
``{"version": 1, "seen": [entry, ...]}``, oldest first, at most :data:`MAX_ENTRIES`; each
entry the fields of :class:`SeenStraggler`. Written whole, atomically (a temporary file
renamed over it): a reader sees the old or the new file, never a part.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import shutil
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

__all__ = [
    "SeenStraggler",
    "FILE_GLOB",
    "seen_path",
    "read_seen",
    "write_seen",
    "copy_seen",
    "read_file",
    "MAX_ENTRIES",
]

#: the file of each node watcher in the run directory
FILE_GLOB = "stragglers-*.json"
#: entries kept per file (the oldest dropped): a job whose straggler comes and goes for days
MAX_ENTRIES = 64
VERSION = 1


@dataclass(frozen=True)
class SeenStraggler:
    """One episode of a straggler as a watcher saw it. ``rank``: global rank; ``group``: the
    process group's name; ``since_step``: its first slow step as the watcher's newest window
    that still held the start found it (None: its first window already began slow);
    ``before_step``: when ``since_step`` is None, the oldest step of the first window that named
    it (it was slow from before); ``first_seen_step``: the newest step at the first check that
    named it; ``first_seen_wall_ns``/``ended_wall_ns``: wall clock (ns since the epoch) of that
    check and of the check that ended it (None: not ended when written); ``host``: the
    watcher's host; ``last``: its newest figures (``details['straggler']`` of the watcher's
    analysis, kept at the start and the end of the episode; None in older files)."""

    rank: int
    group: str
    since_step: Optional[int]
    before_step: Optional[int]
    first_seen_step: Optional[int]
    first_seen_wall_ns: int
    ended_wall_ns: Optional[int] = None
    host: str = ""
    last: Optional[Dict[str, Any]] = None

    @staticmethod
    def from_dict(d: Dict[str, Any]) -> "SeenStraggler":
        """An entry of the file; raises ValueError (naming the field) when it is not one."""

        def opt_int(k: str) -> Optional[int]:
            v = d.get(k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
                raise ValueError("field %r is %r, not an integer or null" % (k, v))
            return v

        rank, wall = opt_int("rank"), opt_int("first_seen_wall_ns")
        if rank is None or wall is None:
            raise ValueError("fields 'rank' and 'first_seen_wall_ns' are required")
        return SeenStraggler(
            rank=rank,
            group=str(d.get("group", "")),
            since_step=opt_int("since_step"),
            before_step=opt_int("before_step"),
            first_seen_step=opt_int("first_seen_step"),
            first_seen_wall_ns=wall,
            ended_wall_ns=opt_int("ended_wall_ns"),
            host=str(d.get("host", "")),
            last=d.get("last") if isinstance(d.get("last"), dict) else None,
        )


def seen_path(run_dir: str, host: str) -> str:
    """``RUN_DIR/stragglers-<host>.json``."""
    return os.path.join(run_dir, "stragglers-%s.json" % host)


def write_seen(path: str, entries: Sequence[SeenStraggler]) -> None:
    """Write ``entries`` (the newest :data:`MAX_ENTRIES`) to ``path`` atomically (a temporary
    file in the same directory, then ``os.replace``). Raises OSError."""
    doc = {"version": VERSION, "seen": [dataclasses.asdict(e) for e in list(entries)[-MAX_ENTRIES:]]}
    tmp = "%s.tmp-%d" % (path, os.getpid())
    try:
        with open(tmp, "w") as f:
            json.dump(doc, f)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def read_seen(*dirs: str) -> Tuple[Tuple[SeenStraggler, ...], List[str]]:
    """Every watcher's entries of the first of ``dirs`` that holds a ``stragglers-*.json`` (a
    snapshot folder keeps its own copy; else the run directory), and one line per unreadable
    file or entry (the file, what is wrong, the remedy; the rest still read). Never raises."""
    out: List[SeenStraggler] = []
    errors: List[str] = []
    for d in dirs:
        paths = sorted(glob.glob(os.path.join(d, FILE_GLOB))) if d else []
        for p in paths:
            _read_one(p, out, errors)
        if paths:
            break
    return tuple(sorted(out, key=lambda e: e.first_seen_wall_ns)), errors


def read_file(path: str) -> Tuple[List[SeenStraggler], List[str]]:
    """The entries of one file and one line per unreadable file or entry (none when the file
    does not exist). Never raises."""
    out: List[SeenStraggler] = []
    errors: List[str] = []
    if os.path.exists(path):
        _read_one(path, out, errors)
    return out, errors


def _read_one(path: str, out: List[SeenStraggler], errors: List[str]) -> None:
    remedy = "its stragglers' start is taken from the rings alone (delete the file to silence this)"
    try:
        with open(path) as f:
            doc = json.load(f)
        items = doc.get("seen") if isinstance(doc, dict) else None
        if not isinstance(items, list):
            raise ValueError("expected an object with a 'seen' list")
    except (OSError, ValueError) as e:
        errors.append("%s: unreadable (%s); %s" % (path, e, remedy))
        return
    for i, item in enumerate(items):
        try:
            if not isinstance(item, dict):
                raise ValueError("not an object")
            out.append(SeenStraggler.from_dict(item))
        except ValueError as e:
            errors.append("%s: entry %d unreadable (%s); %s" % (path, i, e, remedy))


def copy_seen(run_dir: str, into: str) -> None:
    """Copy the run's ``stragglers-*.json`` into a snapshot folder ``into`` (so a copied
    snapshot keeps what the watcher saw until then). Never raises."""
    for p in glob.glob(os.path.join(run_dir, FILE_GLOB)):
        try:
            shutil.copyfile(p, os.path.join(into, os.path.basename(p)))
        except OSError:
            pass
