"""The processes of a run directory's ring files, one ``ProcessInfo`` each (impure).

In: ``ring-<host>-<pid>.htr`` files (``ring/reader.py``), the faulthandler files
``stacks/{sigterm,fatal,dump}-<host>-<pid>.txt`` beside them, /proc of this host (is the
pid still the rank?), memory facts (``memfacts.py``) and Ray's session logs (``ray/raylogs.py``).
Out: ``load_rings`` -> ``(processes, errors)``; ``process_from_ring`` for one ring;
``live_state`` and ``read_signal_files`` for the watcher. Unreadable files become one
``errors`` line each (``error_line``: the file and the remedy).
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import socket
from typing import Any, Dict, List, Optional, Sequence

from hangtrace.tracer.ring import layout as F
from hangtrace.tracer.ring import reader as R
from hangtrace.tracer.errors import HangtraceError
from hangtrace.tracer.snapshot import ProcessInfo
from hangtrace.tracer.process_model import name_senders
from hangtrace.tracer.collect import pidwatch
from hangtrace.tracer.collect.memfacts import memory_facts
from hangtrace.tracer.collect.ray.raylogs import ray_log_facts

RING_GLOB = "ring-*.htr"
HOST = socket.gethostname()


def _proc_ticks(pid: int) -> Optional[int]:
    return F.proc_start_ticks(pid, None)


def gone_or_zombie(pid: int) -> bool:
    """The process ``pid`` no longer runs (gone, or a zombie waiting for its parent)."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except OSError:
        return True


def live_state(header: Dict[str, Any]) -> str:
    """'alive' | 'exited' | 'killed' | 'unknown' for a ring header, checked on this host.

    A pid counts as the same process only if its start time (/proc/PID/stat field 22)
    equals the one recorded at start, so a reused pid is not mistaken for the rank. In the
    node watcher's process (``pidwatch.enable``) a process seen alive is then watched
    through a pidfd: no /proc read per question.
    """
    exited = header["state"] == F.ST_EXITED
    if header["host"] != HOST:
        return "exited" if exited else "unknown"
    pid, recorded = header["pid"], header["proc_start_ticks"]
    known = pids.answer(pid, recorded) if (pids := pidwatch.registry()) is not None else None
    if known is not None:  # (a pidfd held since it was seen alive: no /proc read)
        alive = known
    else:
        ticks = _proc_ticks(pid)
        alive = ticks is not None and (not recorded or ticks == recorded) and not gone_or_zombie(pid)
        if alive and pids is not None:
            pids.seen_alive(pid, recorded)
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
def _mem_samples(records: Any) -> Sequence[Dict[str, Any]]:
    """The process's memory samples, decoded when first read (``ring/memsamples.MemSamples``):
    the memory summary reads their columns, and only the few processes whose samples are
    read one by one (a dead rank's attribution, its DataLoader workers) get sample dicts."""
    try:
        from hangtrace.tracer.ring.memsamples import MemSamples

        return MemSamples(records, from_ring=True)
    except Exception:
        return []


def error_line(path: Optional[str], e: BaseException) -> str:
    """One ``Snapshot.errors`` line for a file that could not be read: the problem and the remedy."""
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
            errors.append(error_line(path, e))
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
    # them live or later, for stored snapshots too when the snapshot lacks them (ray/raylogs.py)
    rfacts = ray_log_facts(
        p for p in procs if not {"ray_worker_exit", "ray_oom_kill"} & set(p.memory_facts or {})
    )
    for i, p in enumerate(procs):
        if p.key in rfacts:
            procs[i] = dataclasses.replace(p, memory_facts=dict(p.memory_facts or {}, **rfacts[p.key]))
    procs = sorted(name_senders(procs), key=lambda p: (p.rank < 0, p.rank, p.host, p.pid))  # (exited senders)
    return procs, errors
