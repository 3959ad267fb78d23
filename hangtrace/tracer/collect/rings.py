"""Collector: turn a run directory (live or not) into a Snapshot, and store snapshots.

A run directory holds ``ring-<host>-<pid>.htr`` files, ``stacks/{sigterm,fatal,dump}-
<host>-<pid>.txt`` faulthandler outputs and ``hangtrace.log``. A stored snapshot
``RUN_DIR/snapshots/<UTC time>/`` holds compact copies of the rings, ``processes.json``
(state of each process when taken), ``stacks/<host>-<pid>.json`` (py-spy or
faulthandler stacks), and, once analysed, ``diagnosis.json`` and ``report.txt``.

Unreadable files never stop a collection: each becomes one line in ``Snapshot.errors``
naming the file and the remedy, and the other processes are analysed.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import socket
import time
from typing import Any, Dict, List, Optional

import orjson

from hangtrace.tracer.ring import layout as F
from hangtrace.tracer.ring import reader as R
from hangtrace.tracer.errors import HangtraceError, RunDirError
from hangtrace.tracer.snapshot import ProcessInfo, Snapshot
from hangtrace.tracer.process_model import assign_roles, name_senders
from hangtrace.tracer.collect.memfacts import memory_facts, parse_kernel_oom, read_kernel_log  # noqa: F401
from hangtrace.tracer.collect.raylogs import ray_log_facts

RING_GLOB = "ring-*.htr"
_HOST = socket.gethostname()


def _proc_ticks(pid: int) -> Optional[int]:
    return F.proc_start_ticks(pid, None)


def _zombie(pid: int) -> bool:
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except OSError:
        return True


def live_state(header: Dict[str, Any]) -> str:
    """'alive' | 'exited' | 'killed' | 'unknown' for a ring header, checked on this host.

    A pid counts as the same process only if its start time (/proc/PID/stat field 22)
    equals the one recorded at start, so a reused pid is not mistaken for the rank.
    """
    exited = header["state"] == F.ST_EXITED
    if header["host"] != _HOST:
        return "exited" if exited else "unknown"
    ticks = _proc_ticks(header["pid"])
    alive = (
        ticks is not None
        and (not header["proc_start_ticks"] or ticks == header["proc_start_ticks"])
        and not _zombie(header["pid"])
    )
    if alive:
        return "alive"
    return "exited" if exited else "killed"


def read_signal_files(run_dir: str, host: str, pid: int, names: Optional[set] = None) -> Dict[str, Any]:
    """{'sigterm'|'fatal'|'dump': {'wall_ns', 'text', 'path'}} for non-empty faulthandler files.

    ``names``: the file names in ``run_dir/stacks`` when already listed (None = look)."""
    out: Dict[str, Any] = {}
    for kind in ("sigterm", "fatal", "dump"):
        name = "%s-%s-%d.txt" % (kind, host, pid)
        if names is not None and name not in names:
            continue
        p = os.path.join(run_dir, "stacks", name)
        try:
            st = os.stat(p)
            if st.st_size == 0:
                continue
            with open(p, "r", errors="replace") as f:
                text = f.read(1 << 20)
        except OSError:
            continue
        out[kind] = {"wall_ns": int(st.st_mtime * 1e9), "text": text, "path": p}
        sender = signal_sender(text) if kind == "sigterm" else None
        if sender is not None:
            out[kind]["sender"] = sender
    return out


_SENDER = re.compile(r"^hangtrace: SIGTERM from pid (\d+) uid (\d+): (.*)$", re.M)


def signal_sender(text: str) -> Optional[Dict[str, Any]]:
    """The first SIGTERM sender line of a SIGTERM stack file (``_fastrec.sigterm_sender_target``):
    ``{'pid', 'uid', 'cmdline'}`` (``cmdline``: its command line, or "<comm> (exited)"), or None."""
    m = _SENDER.search(text or "")
    if m is None:
        return None
    return {"pid": int(m.group(1)), "uid": int(m.group(2)), "cmdline": m.group(3).strip()}


def process_from_ring(ring: R.RingData, state: Optional[str] = None, **fields: Any) -> ProcessInfo:
    """Build a ProcessInfo from RingData (``state`` overrides the live check; ``fields``
    set or override any other ProcessInfo field, e.g. ``signals``).

    The process gets the ring's summary and, as ``records``, the summary's record subset
    (``RingSummary.records()``); a ring read with every record keeps them all.
    """
    h = ring.header
    summ = ring.summary
    recs = ring.records or summ.records()
    kw: Dict[str, Any] = dict(
        host=h["host"],
        pid=h["pid"],
        rank=h["rank"],
        local_rank=h["local_rank"],
        world_size=h["world_size"],
        run_id=h["run_id"],
        state=state or live_state(h),
        exit_code=h["exit_code"] if h["state"] == F.ST_EXITED else None,
        exit_wall_ns=h["exit_wall_ns"],
        start_wall_ns=h["start_wall_ns"],
        phase=h.get("phase"),
        step=h["step"] if h["step"] >= 0 else None,
        progress_wall_ns=h["progress_wall_ns"],
        progress_mono_ns=h["progress_mono_ns"],
        inflight=dict(summ.inflight) if summ.inflight is not None else None,
        records=list(recs),
        groups=ring.groups,
        events=ring.events,
        meta=dict(
            ring.meta,
            dump_signal=h["dump_signal"],
            proc_start_ticks=h["proc_start_ticks"],
            progress_count=h["progress_count"],
            ppid=h["ppid"],
            rank_source=h.get("rank_source", 0),
        ),
        ring_path=ring.path,
        warnings=list(ring.warnings),
        memory=_mem_samples(summ.memory),
        summary=summ,
    )
    kw.update(fields)
    return ProcessInfo(**kw)


# --- memory (issue 5): samples from the ring; OOM evidence in collect/memfacts.py ---
def _mem_samples(records: Any) -> List[Dict[str, Any]]:
    try:
        from hangtrace.tracer.analyze.memory import samples

        return samples(records)
    except Exception:
        return []


def _error_line(path: Optional[str], e: BaseException) -> str:
    if isinstance(e, HangtraceError):
        return "%s (remedy: %s)" % (e, e.remedy) if e.remedy else str(e)
    return "%s: %s (remedy: check the file's permissions; run as the job's user or root)" % (path, e)


def load_rings(
    ring_dir: str,
    run_dir: Optional[str] = None,
    states: Optional[Dict[str, Any]] = None,
    live_facts: Optional[bool] = True,
    records: bool = False,
) -> "tuple[List[ProcessInfo], List[str]]":
    """Read every ring in ``ring_dir``; return ``(processes, errors)``.

    ``states`` maps ``"host:pid"`` to a stored state (snapshots); without it the state
    is checked live. Signal files are read from ``run_dir`` (default ``ring_dir``).
    Memory facts (cgroup counter now, kernel log) are stored ones with ``states``; else
    read now when ``live_facts`` is True, never when False, and when None only if a
    process of the run is still alive (the cgroup/kernel state is then current; for a
    run that is over it is today's, not the one of the deaths).
    ``records``: True decodes every record into ``ProcessInfo.records`` (``hangtrace
    records``); False (collection) reads each ring's summary only.
    """
    procs: List[ProcessInfo] = []
    errors: List[str] = []
    kcache: Dict[str, Any] = {}
    fresh = []
    try:
        names: Optional[set] = set(os.listdir(os.path.join(run_dir or ring_dir, "stacks")))
    except OSError:
        names = set()
    for path in sorted(glob.glob(os.path.join(ring_dir, RING_GLOB))):
        try:
            ring = R.read_ring(path, records=records)
        except (HangtraceError, OSError) as e:
            errors.append(_error_line(path, e))
            continue
        h = ring.header
        st = states.get("%s:%d" % (h["host"], h["pid"])) if states else None
        upd: Dict[str, Any] = {"signals": read_signal_files(run_dir or ring_dir, h["host"], h["pid"], names)}
        if st:
            upd["exit_code"] = st.get("exit_code", h["exit_code"] if h["state"] == F.ST_EXITED else None)
            upd["memory_facts"] = st.get("memory_facts") or {}
        p = process_from_ring(ring, st.get("state") if st else None, **upd)
        if not st:
            fresh.append(len(procs))
        for w in p.warnings:
            errors.append("%s: %s" % (path, w))
        procs.append(p)
    if live_facts is None:
        live_facts = any(p.state == "alive" for p in procs)
    for i in fresh if live_facts else ():
        facts = memory_facts(procs[i], kcache)
        if facts:
            procs[i] = dataclasses.replace(procs[i], memory_facts=facts)
    # Ray's record of dead workers from its session logs: they outlive the cluster, so read
    # them live or later, for stored snapshots too when the snapshot lacks them (raylogs.py)
    rfacts = ray_log_facts(
        p for p in procs if not {"ray_worker_exit", "ray_oom_kill"} & set(p.memory_facts or {})
    )
    for i, p in enumerate(procs):
        if p.key in rfacts:
            procs[i] = dataclasses.replace(p, memory_facts=dict(p.memory_facts or {}, **rfacts[p.key]))
    procs = sorted(name_senders(procs), key=lambda p: (p.rank < 0, p.rank, p.host, p.pid))  # (exited senders)
    return procs, errors


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
    return Snapshot(
        run_dir=os.path.abspath(run_dir),
        taken_wall_ns=time.time_ns(),
        reason="offline",
        processes=procs,
        errors=errors,
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
    has_fr = os.path.isdir(os.path.join(snap_dir, "fr"))  # Flight Recorder dumps: join every record
    procs, errs = load_rings(
        os.path.join(snap_dir, "rings"),
        run_dir=snap_dir,
        states=states,
        live_facts=False,
        records=records or has_fr,
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
    snap = Snapshot(
        run_dir=meta.get("run_dir", os.path.dirname(os.path.dirname(snap_dir))),
        taken_wall_ns=meta.get("taken_wall_ns", 0),
        reason=meta.get("reason", "offline"),
        processes=procs,
        errors=errors + meta.get("errors", []),
        path=snap_dir,
    )
    return _with_fr(snap_dir, snap) if has_fr else snap


def _stacks_for(procs: List[ProcessInfo], native: bool, run_dir: str) -> List[ProcessInfo]:
    """``procs`` with stacks of the alive ones: py-spy in parallel, faulthandler fallback."""
    from hangtrace.tracer.collect import stacks as S
    from hangtrace.tracer.collect.faulthandler import request_faulthandler_dump

    alive = [p for p in procs if p.state == "alive"]
    if not alive:
        return procs
    try:
        res = S.dump_stacks([p.pid for p in alive], native=native)
    except Exception as e:  # py-spy missing or broken: use the fallback for all
        res = {p.pid: {"threads": None, "source": None, "error": str(e)} for p in alive}
    out = []
    for p in procs:
        if p.state != "alive":
            out.append(p)
            continue
        r = res.get(p.pid) or {}
        if r.get("threads"):
            out.append(
                dataclasses.replace(
                    p,
                    stacks=r["threads"],
                    stack_source=r.get("source", "py-spy"),
                    children=tuple(r.get("children") or ()),
                )
            )
            continue
        err = r.get("error") or "no stacks"
        stacks, source = p.stacks, p.stack_source
        sig = p.meta.get("dump_signal") or 0
        if sig:
            dump = os.path.join(run_dir, "stacks", "dump-%s-%d.txt" % (p.host, p.pid))
            try:
                threads = request_faulthandler_dump(p.pid, sig, dump)
            except Exception as e:
                threads = None
                err += "; faulthandler fallback failed: %s" % e
            if threads:
                stacks, source = threads, "faulthandler"
        else:
            err += "; no faulthandler fallback (the process registered no dump signal)"
        out.append(dataclasses.replace(p, stacks=stacks, stack_source=source, stack_error=err))
    return out


def take_snapshot(
    run_dir: str, reason: str = "request", native: bool = False, with_stacks: bool = True
) -> Snapshot:
    """Collect a snapshot of a live run into ``RUN_DIR/snapshots/<UTC time>/``.

    Copies the used part of every ring, records process states, takes stacks of every
    alive traced process (py-spy, in parallel; faulthandler fallback). Returns the
    Snapshot (with ``path`` set). Raises RunDirError if ``run_dir`` has no rings.
    The traced processes keep running.
    """
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + ".%03d" % (time.time_ns() // 1000000 % 1000)
    sdir = os.path.join(run_dir, "snapshots", stamp)
    os.makedirs(os.path.join(sdir, "rings"), mode=0o700, exist_ok=True)
    fr = _fr_dumps(run_dir, sdir) if with_stacks else []  # before the rings: FR is never newer
    snap = load_run(run_dir, live_facts=True, records=bool(fr))  # memory facts now, in processes.json
    os.makedirs(os.path.join(sdir, "stacks"), mode=0o700, exist_ok=True)
    snap = dataclasses.replace(snap, reason=reason, path=sdir)
    for p in snap.processes:
        assert p.ring_path is not None  # load_run reads processes from their rings
        try:
            R.compact_copy(p.ring_path, os.path.join(sdir, "rings", os.path.basename(p.ring_path)))
        except (HangtraceError, OSError) as e:
            snap.errors.append(_error_line(p.ring_path, e))
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
        snap = dataclasses.replace(snap, processes=_stacks_for(snap.processes, native, run_dir))
    for p in snap.processes:
        if p.stacks is not None:
            with open(os.path.join(sdir, "stacks", "%s-%d.json" % (p.host, p.pid)), "wb") as f:
                f.write(
                    orjson.dumps(
                        {
                            "threads": p.stacks,
                            "source": p.stack_source,
                            "error": p.stack_error,
                            "children": list(p.children),
                        }
                    )
                )
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
    with open(os.path.join(sdir, "processes.json"), "wb") as f:
        f.write(orjson.dumps(meta, option=orjson.OPT_INDENT_2))
    return _with_fr(sdir, snap) if fr else snap


def _fr_dumps(run_dir: str, sdir: str) -> List[str]:
    """The Flight Recorder dumps of this host's live traced processes, copied into
    ``sdir/fr`` (issue 10; ``collect/frrequest.py``). Never raises."""
    from hangtrace.hooks.torchdist.fr_agent import fr_dir

    if not os.path.isdir(fr_dir(run_dir)):
        return []
    from hangtrace.tracer.collect.frrequest import fr_into_snapshot

    pids = [
        int(m.group(1))
        for m in (re.match(r"ring-%s-(\d+)\.htr$" % re.escape(_HOST), b) for b in os.listdir(run_dir))
        if m
    ]
    return fr_into_snapshot(run_dir, pids, sdir)


def _with_fr(sdir: str, snap: Snapshot) -> Snapshot:
    """``snap`` with the Flight Recorder dumps of ``sdir/fr`` joined (``frdump``), and the
    pending asyncio tasks the agents wrote beside them (``asynciotasks``)."""
    from hangtrace.tracer.collect.asynciotasks import with_tasks
    from hangtrace.tracer.collect.frdump import snapshot_with_fr

    return with_tasks(sdir, snapshot_with_fr(sdir, snap))


def write_diagnosis(snap: Snapshot, diag: Any, text: str) -> None:
    """Store ``diagnosis.json`` and ``report.txt`` in the snapshot folder (if any)."""
    from hangtrace.tracer.report.text import diagnosis_json

    if not snap.path:
        return
    with open(os.path.join(snap.path, "diagnosis.json"), "wb") as f:
        f.write(orjson.dumps(diagnosis_json(diag), option=orjson.OPT_INDENT_2))
    with open(os.path.join(snap.path, "report.txt"), "w") as f:
        f.write(text)
