"""Inputs and output of the timeline (the only I/O of ``report/timeline``).

Inputs: a run directory (its newest snapshot when one exists, else its rings as they are
now) or a snapshot folder; the snapshot's ``diagnosis.json`` (verdict marks); the deep
traces ``RUN_DIR/deep/deep-<host>-<pid>.json`` with their clock files
``deep-<host>-<pid>.clock.json`` (``hooks/deep.py``). Output: JSON, gzip when the file
name ends in ``.gz`` (Perfetto and vizviewer open both).
"""

import glob
import gzip
import dataclasses
import os
from typing import Any, Dict, List, Optional, Tuple

import orjson

from hangtrace.tracer.report.timeline.build import DeepTrace, build_timeline
from hangtrace.tracer.report.timeline.model import TimelineOptions
from hangtrace.tracer.snapshot import Snapshot

#: File name of the timeline written next to ``report.txt`` at each incident.
INCIDENT_FILE = "timeline.json"


def read_deep(run_dir: str) -> Tuple[List[DeepTrace], List[str]]:
    """Deep traces of ``run_dir`` (``RUN_DIR/deep/*.json``) and one error line per unreadable
    file. A dump without its clock file is skipped (it cannot be placed on the timeline)."""
    out: List[DeepTrace] = []
    errors: List[str] = []
    for path in sorted(glob.glob(os.path.join(run_dir, "deep", "deep-*.json"))):
        if path.endswith(".clock.json"):
            continue
        cpath = path[: -len(".json")] + ".clock.json"
        try:
            with open(cpath, "rb") as f:
                ck = orjson.loads(f.read())
            with open(path, "rb") as f:
                data = orjson.loads(f.read())
            out.append(
                DeepTrace(
                    host=str(ck["host"]),
                    pid=int(ck["pid"]),
                    viz_us=float(ck["viz_us"]),
                    mono_ns=int(ck["mono_ns"]),
                    events=tuple(data.get("traceEvents") or ()),
                    path=path,
                )
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            errors.append("%s: unreadable deep trace (%s); timeline made without it" % (path, e))
    return out, errors


def read_diagnosis(snap_dir: Optional[str]) -> Optional[Dict[str, Any]]:
    """The stored ``diagnosis.json`` of a snapshot folder, or None."""
    if not snap_dir:
        return None
    try:
        with open(os.path.join(snap_dir, "diagnosis.json"), "rb") as f:
            d = orjson.loads(f.read())
        return d if isinstance(d, dict) else None
    except (OSError, ValueError):
        return None


def load_for_timeline(path: str) -> Tuple[Snapshot, Optional[Dict[str, Any]], str]:
    """(snapshot, stored verdict or None, source description) for a RUN_DIR or SNAPSHOT.

    Raises RunDirError (exit 4) when ``path`` holds neither rings nor a snapshot.
    """
    from hangtrace.tracer.collect.rings import is_snapshot, load_run, load_snapshot, newest_snapshot

    # every record, not the analysis' compact summary: the timeline draws them all
    if is_snapshot(path):
        snap = load_snapshot(path, records=True)
    else:
        newest = newest_snapshot(path) if os.path.isdir(path) else None
        snap = (
            load_snapshot(newest, records=True) if newest else load_run(path, live_facts=False, records=True)
        )
    src = snap.path or snap.run_dir
    return snap, read_diagnosis(snap.path), src


def write_trace(trace: Dict[str, Any], path: str) -> int:
    """Write ``trace`` as JSON (gzip when ``path`` ends in ``.gz``). Returns bytes written.
    Raises OSError."""
    data = orjson.dumps(trace)
    if path.endswith(".gz"):
        data = gzip.compress(data, compresslevel=6)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    return len(data)


def write_stdout(trace: Dict[str, Any]) -> int:
    """Write ``trace`` as JSON to standard output (``-o -``). Returns bytes written. Raises OSError."""
    import sys

    data = orjson.dumps(trace)
    sys.stdout.flush()
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()
    return len(data)


def read_trace(path: str) -> Dict[str, Any]:
    """A trace file written by ``write_trace`` (gzip when ``path`` ends in ``.gz``), as a dict.
    Raises OSError, ValueError (not JSON)."""
    with open(path, "rb") as f:
        data = f.read()
    if path.endswith(".gz"):
        data = gzip.decompress(data)
    out = orjson.loads(data)
    if not isinstance(out, dict):
        raise ValueError("%s: not a trace-event JSON object" % path)
    return out


def timeline_of(path: str, options: TimelineOptions = TimelineOptions()) -> Tuple[Dict[str, Any], Snapshot]:
    """Build the trace of a RUN_DIR or SNAPSHOT (with its verdict and deep traces)."""
    snap, diag, src = load_for_timeline(path)
    deep, errs = read_deep(snap.run_dir)
    trace = build_timeline(snap, diag, deep, options, source=src)
    if errs or snap.errors:
        trace["otherData"]["errors"] = list(snap.errors) + errs + trace["otherData"].get("errors", [])
    return trace, snap


def write_incident_timeline(snap: Snapshot, diagnosis: Optional[Dict[str, Any]]) -> Optional[str]:
    """Write ``timeline.json`` into the snapshot folder ``snap.path`` (the watcher and
    ``hangtrace run`` call this at each incident). Returns its path, or None when the
    snapshot has no folder. Raises OSError."""
    if not snap.path:
        return None
    from hangtrace.tracer.collect.rings import is_snapshot, load_snapshot

    full = snap
    if is_snapshot(snap.path):  # the analysis kept a compact summary: decode every record
        full = dataclasses.replace(
            load_snapshot(snap.path, records=True), reason=snap.reason, taken_wall_ns=snap.taken_wall_ns
        )
    deep, errs = read_deep(snap.run_dir)
    trace = build_timeline(full, diagnosis, deep, TimelineOptions(), source=snap.path)
    if errs:
        trace["otherData"]["errors"] = errs + trace["otherData"].get("errors", [])
    out = os.path.join(snap.path, INCIDENT_FILE)
    write_trace(trace, out)
    return out
