"""Collector: turn a run directory (live or not) into a Snapshot, and store snapshots.

A run directory holds ``ring-<host>-<pid>.htr`` files, ``stacks/{sigterm,fatal,dump}-
<host>-<pid>.txt`` faulthandler outputs and ``hangtrace.log``. A stored snapshot
``RUN_DIR/snapshots/<UTC time>/`` holds compact copies of the rings, ``processes.json``
(state of each process when taken), ``stacks/<host>-<pid>.json`` (py-spy or
faulthandler stacks), and, once analysed, ``diagnosis.json`` and ``report.txt``.

In: a run directory or a snapshot folder. Out: a ``Snapshot`` (``load_run``,
``load_snapshot``, ``take_snapshot``, ``load_run_or_fr``); each ring's process is read by
``ringprocs.py``; Flight Recorder dumps (read by ``frdump.py``) are joined into the
processes by ``snapshot_with_fr`` (``ring/frjoin.py``).

Unreadable files never stop a collection: each becomes one line in ``Snapshot.errors``
naming the file and the remedy, and the other processes are analysed.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import time
from typing import Any, Dict, List, Optional, Set

import orjson

from hangtrace.tracer.ring import reader as R
from hangtrace.tracer.errors import HangtraceError, RunDirError
from hangtrace.tracer.snapshot import ProgressWindow, Snapshot
from hangtrace.tracer.stragglerseen import copy_seen, read_seen
from hangtrace.tracer.process_model import assign_roles
from hangtrace.tracer.collect.frdump import find_fr_files, load_fr_dir
from hangtrace.tracer.collect.frrequest import SNAPSHOT_FR_TIMEOUT_S
from hangtrace.tracer.collect.livestacks import gap_lines, stacks_for
from hangtrace.tracer.collect.ringprocs import HOST, error_line, load_rings


def is_snapshot(path: str) -> bool:
    """True when ``path`` is a stored snapshot folder (it holds processes.json)."""
    return os.path.isfile(os.path.join(path, "processes.json"))


def newest_snapshot(run_dir: str) -> Optional[str]:
    """The newest ``RUN_DIR/snapshots/<time>`` folder, or None."""
    snaps = sorted(glob.glob(os.path.join(run_dir, "snapshots", "*", "processes.json")))
    return os.path.dirname(snaps[-1]) if snaps else None


def load_run(run_dir: str, live_facts: Optional[bool] = None, records: bool = False) -> Snapshot:
    """Snapshot of ``run_dir`` as its files are now (no stacks, nothing written).

    ``live_facts``, ``records``: see :func:`load_rings`; by default memory facts are read only while a
    process of the run is alive (offline analysis of a finished run uses none).

    Raises RunDirError when the directory does not exist or holds no ring file.
    """
    if not os.path.isdir(run_dir):
        raise RunDirError(
            "run directory %s does not exist" % run_dir,
            "pass the directory printed by `hangtrace run`, or HANGTRACE_DIR of the job",
        )
    procs, errors = load_rings(run_dir, live_facts=live_facts, records=records)
    if not procs and not errors:
        raise RunDirError(
            "no ring files (ring-*.htr) in %s" % run_dir,
            "was the job started with HANGTRACE=1 and this HANGTRACE_DIR?",
        )
    seen, seen_errors = read_seen(run_dir)  # what the watcher saw (issue 43)
    return Snapshot(
        run_dir=os.path.abspath(run_dir),
        taken_wall_ns=time.time_ns(),
        reason="offline",
        processes=procs,
        errors=errors + seen_errors,
        stragglers_seen=seen,
    )


def load_snapshot(snap_dir: str, records: bool = False) -> Snapshot:
    """Read a stored snapshot folder (``records``: decode every record, as for the
    timeline; default the compact summary). Raises RunDirError if it is not one."""
    if not is_snapshot(snap_dir):
        raise RunDirError(
            "%s is not a snapshot (no processes.json)" % snap_dir, "pass RUN_DIR or RUN_DIR/snapshots/<time>"
        )
    errors = []
    try:
        with open(os.path.join(snap_dir, "processes.json"), "rb") as f:
            meta = orjson.loads(f.read())
    except (OSError, ValueError) as e:
        meta = {"processes": {}}
        errors.append(
            "%s: unreadable (%s); process states are checked live instead"
            % (os.path.join(snap_dir, "processes.json"), e)
        )
    if not isinstance(meta, dict) or not isinstance(meta.get("processes", {}), dict):
        errors.append(
            "%s: unreadable (expected an object with a 'processes' object); process states "
            "are checked live instead" % os.path.join(snap_dir, "processes.json")
        )
        meta = {"processes": {}}
    if not isinstance(meta.get("errors", []), list):
        meta["errors"] = []
    states = {k: v for k, v in meta.get("processes", {}).items() if isinstance(v, dict)}
    # memory facts: only the stored ones (never today's cgroup/kernel state)
    has_fr = os.path.isdir(os.path.join(snap_dir, "fr"))
    # Flight Recorder dumps join the summary's records and its window of newest records
    # (ring/frjoin.py), not every record (issue 40)
    procs, errs = load_rings(
        os.path.join(snap_dir, "rings"),
        run_dir=snap_dir,
        states=states,
        live_facts=False,
        records=records,
    )
    errors += errs
    for i, p in enumerate(procs):
        sp = os.path.join(snap_dir, "stacks", "%s-%d.json" % (p.host, p.pid))
        if os.path.exists(sp):
            try:
                with open(sp, "rb") as f:
                    d = orjson.loads(f.read())
                if not isinstance(d, dict) or not isinstance(d.get("threads"), (list, type(None))):
                    raise ValueError("expected an object with a 'threads' list")
                procs[i] = dataclasses.replace(
                    p,
                    stacks=d.get("threads"),
                    stack_source=d.get("source"),
                    stack_error=d.get("error"),
                    children=tuple(c for c in d.get("children") or () if isinstance(c, dict)),
                )
            except (OSError, ValueError) as e:
                errors.append("%s: unreadable stacks (%s); analysed without them" % (sp, e))
        else:
            st = states.get(p.key, {})
            procs[i] = dataclasses.replace(p, stack_error=st.get("stack_error"))
    run_dir = meta.get("run_dir", os.path.dirname(os.path.dirname(snap_dir)))
    seen, seen_errors = read_seen(snap_dir, run_dir if isinstance(run_dir, str) else "")
    snap = Snapshot(
        run_dir=run_dir,
        taken_wall_ns=meta.get("taken_wall_ns", 0),
        reason=meta.get("reason", "offline"),
        processes=procs,
        errors=errors + meta.get("errors", []) + seen_errors,
        path=snap_dir,
        window=_read_window(snap_dir),
        stragglers_seen=seen,
    )
    return _with_fr(snap_dir, snap) if has_fr else snap


#: the snapshot folder's file of its window (``dump``'s two readings, issue 38)
WINDOW_FILE = "window.json"


def write_window(snap: Snapshot) -> None:
    """Store ``snap.window`` in its folder (``window.json``) so that ``analyze`` of the
    stored snapshot judges it as ``dump`` did. Never raises."""
    if snap.window is None or not snap.path:
        return
    try:
        with open(os.path.join(snap.path, WINDOW_FILE), "wb") as f:
            f.write(orjson.dumps(dataclasses.asdict(snap.window)))
    except OSError:
        pass


def _read_window(snap_dir: str) -> Optional[ProgressWindow]:
    """The stored window of a snapshot folder, or None (none, or unreadable)."""
    try:
        with open(os.path.join(snap_dir, WINDOW_FILE), "rb") as f:
            d = orjson.loads(f.read())
        return ProgressWindow(
            window_s=float(d["window_s"]),
            source=str(d.get("source", "rings")),
            advanced=tuple(str(k) for k in d.get("advanced", ())),
            unread=tuple(str(k) for k in d.get("unread", ())),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def take_snapshot(
    run_dir: str, reason: str = "request", native: bool = False, with_stacks: bool = True
) -> Snapshot:
    """Collect a snapshot of a live run into ``RUN_DIR/snapshots/<UTC time>/``.

    Stores every ring (``ring.reader.snapshot_copy``: a hard link for a process that is
    gone, else its recorded part), records process states, takes stacks of every
    alive traced process (py-spy, in parallel; faulthandler fallback). Returns the
    Snapshot (with ``path`` set). Raises RunDirError if ``run_dir`` has no rings.
    The traced processes keep running. What it could not collect is a line in ``errors``
    and the rest is analysed: stacks and Flight Recorder answers (``livestacks.gap_lines``),
    the folder itself when the run directory is deleted meanwhile (never made again).
    """
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + ".%03d" % (time.time_ns() // 1000000 % 1000)
    sdir = os.path.join(run_dir, "snapshots", stamp)
    os.makedirs(os.path.join(sdir, "rings"), mode=0o700, exist_ok=True)
    silent: Set[int] = set()  # agents that took the request and did not answer
    fr = _fr_dumps(run_dir, sdir, silent) if with_stacks else []  # before the rings: FR is never newer
    snap = load_run(run_dir, live_facts=True)  # memory facts now, in processes.json
    copy_seen(run_dir, sdir)  # the watcher's stragglers until now (issue 43)
    stored = _mkdir_in(sdir, "stacks")
    snap = dataclasses.replace(snap, reason=reason, path=sdir)
    for p in snap.processes:
        assert p.ring_path is not None  # load_run reads processes from their rings
        try:
            R.snapshot_copy(
                p.ring_path,
                os.path.join(sdir, "rings", os.path.basename(p.ring_path)),
                frozen=p.state in ("exited", "killed"),
            )
        except (HangtraceError, OSError) as e:
            snap.errors.append(error_line(p.ring_path, e))
        for kind, s in p.signals.items():
            try:
                with open(os.path.join(sdir, "stacks", os.path.basename(s["path"])), "w") as f:
                    f.write(s["text"])
                os.utime(
                    os.path.join(sdir, "stacks", os.path.basename(s["path"])), ns=(s["wall_ns"], s["wall_ns"])
                )
            except OSError:
                pass
    if with_stacks:
        snap = dataclasses.replace(snap, processes=stacks_for(snap.processes, native, run_dir))
        snap.errors.extend(gap_lines(snap.processes, HOST, silent, SNAPSHOT_FR_TIMEOUT_S))
    for p in snap.processes:
        if p.stacks is not None and stored:
            doc = {
                "threads": p.stacks,
                "source": p.stack_source,
                "error": p.stack_error,
                "children": list(p.children),
            }
            stored = _write(os.path.join(sdir, "stacks", "%s-%d.json" % (p.host, p.pid)), doc, indent=False)
    if not stored:
        snap.errors.append(_UNSTORED % (sdir, run_dir))
    roles = assign_roles(snap.processes)  # what each process is (its "rank" is only the RANK it had)
    meta = {
        "run_dir": os.path.abspath(run_dir),
        "taken_wall_ns": time.time_ns(),
        "reason": reason,
        "errors": snap.errors,
        "processes": {
            p.key: {
                "state": p.state,
                "exit_code": p.exit_code,
                "rank": p.rank,
                "role": roles.role(p).value,
                "helper_of": roles.helper_of.get(p.key),
                "stack_error": p.stack_error,
                "memory_facts": p.memory_facts,
            }
            for p in snap.processes
        },
    }
    if stored and not _write(os.path.join(sdir, "processes.json"), meta):
        snap.errors.append(_UNSTORED % (sdir, run_dir))
    return _with_fr(sdir, snap) if fr else snap


#: the ``Snapshot.errors`` line of a snapshot whose folder could not be written
_UNSTORED = (
    "%s: the snapshot could not be stored (its folder is gone: was %s deleted during the dump?); "
    "the verdict is from what was read before"
)


def _mkdir_in(parent: str, name: str) -> bool:
    """Make ``parent/name`` (0700) when ``parent`` still exists (never its parents: a run
    directory deleted during a dump is not made again). True when it exists now."""
    try:
        os.mkdir(os.path.join(parent, name), mode=0o700)
    except FileExistsError:
        pass
    except OSError:
        return False
    return True


def _write(path: str, doc: Any, indent: bool = True) -> bool:
    """Write ``doc`` as JSON to ``path``; False when its folder is gone (or unwritable)."""
    try:
        with open(path, "wb") as f:
            f.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2 if indent else None))
    except OSError:
        return False
    return True


def _fr_dumps(run_dir: str, sdir: str, silent: Set[int]) -> List[str]:
    """The Flight Recorder dumps of this host's live traced processes, copied into
    ``sdir/fr`` (issue 10; ``collect/frrequest.py``); ``silent`` gets the pids whose agent
    did not answer in time. Never raises."""
    from hangtrace.hooks.torchdist.fr_agent import fr_dir

    if not os.path.isdir(fr_dir(run_dir)):
        return []
    from hangtrace.tracer.collect.frrequest import fr_into_snapshot

    pids = [
        int(m.group(1))
        for m in (re.match(r"ring-%s-(\d+)\.htr$" % re.escape(HOST), b) for b in os.listdir(run_dir))
        if m
    ]
    return fr_into_snapshot(run_dir, pids, sdir, silent=silent)


def _with_fr(sdir: str, snap: Snapshot) -> Snapshot:
    """``snap`` with the Flight Recorder dumps of ``sdir/fr`` joined (``snapshot_with_fr``), and the
    pending asyncio tasks the agents wrote beside them (``asynciotasks``)."""
    from hangtrace.tracer.collect.asynciotasks import with_tasks

    return with_tasks(sdir, snapshot_with_fr(sdir, snap))


def write_diagnosis(snap: Snapshot, doc: Dict[str, Any], text: str) -> None:
    """Store ``diagnosis.json`` (``doc``: the diagnosis as JSON-able data,
    ``report.text.diagnosis_json``) and ``report.txt`` (``text``) in the snapshot folder
    (if any). Never raises OSError."""
    if not snap.path:
        return
    try:  # (a folder deleted during the dump: Snapshot.errors says the snapshot is not stored)
        with open(os.path.join(snap.path, "diagnosis.json"), "wb") as f:
            f.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
        with open(os.path.join(snap.path, "report.txt"), "w") as f:
            f.write(text)
    except OSError:
        pass


def snapshot_with_fr(path: str, snap: Any = None) -> Any:
    """``snap`` (a ``Snapshot`` or None) with the Flight Recorder dumps of ``path`` joined.

    None and dumps present -> a Snapshot of the dumps alone (``taken_wall_ns`` = newest
    dump's mtime). No dumps -> ``snap`` unchanged. Unreadable dumps add lines to ``errors``.
    """
    if not find_fr_files(path):
        return snap
    from hangtrace.tracer.ring.frjoin import cutoffs, fr_processes, join_fr

    errors: List[str] = []
    # of each dump only the entries its process's window can join are parsed (issue 40)
    procs = list(snap.processes) if snap is not None else []
    windows: Dict[int, Any] = {}  # (frjoin.Windows: each joined process's window, made once)
    dumps = load_fr_dir(path, errors, cutoffs(procs, windows) if snap is not None else None)
    if snap is None:
        return Snapshot(
            run_dir=os.path.abspath(path),
            reason="offline",
            processes=fr_processes(dumps),
            taken_wall_ns=max([d.written_wall_ns for d in dumps] or [0]),
            errors=errors,
        )
    return dataclasses.replace(
        snap, processes=join_fr(procs, dumps, windows), errors=list(snap.errors) + errors
    )


def load_run_or_fr(path: str) -> Any:
    """``load_run(path)`` joined with the dumps in ``path``; the dumps alone when the
    directory has no ring file. Raises what ``load_run`` raises when it has neither."""

    has_dumps = bool(find_fr_files(path))
    try:  # dumps join the summaries' records and newest records (ring/frjoin.py, issue 40)
        snap = load_run(path)
    except RunDirError:
        if not has_dumps:
            raise
        snap = None
    return snapshot_with_fr(path, snap)
