"""Snapshot (+ verdict, + deep traces) in, Chrome trace-event JSON dict out (pure).

The trace-event format is the one viztracer writes and Perfetto, ``vizviewer`` and
``chrome://tracing`` load ("Trace Event Format", Google, 2016: ``X`` complete slices,
``b``/``e`` async slices, ``i`` instants, ``C`` counters, ``s``/``t``/``f`` flows,
``M`` metadata). ``ts``/``dur`` are microseconds since ``otherData.t0_wall_ns``.
"""

from dataclasses import dataclass
from typing import Any, Dict, FrozenSet, List, Optional, Sequence, Tuple

from hangtrace.tracer.report.timeline import window as win
from hangtrace.tracer.report.timeline.events import ProcessEvents
from hangtrace.tracer.report.timeline.frclock import align_fr
from hangtrace.tracer.report.timeline.model import Clock, Event, FlowRefs, Mark, Threads, TimelineOptions
from hangtrace.tracer.report.timeline.model import Track, assign_tracks, end_wall_ns, host_offsets
from hangtrace.tracer.report.timeline.model import straggler_of
from hangtrace.tracer.snapshot import ProcessInfo, Snapshot

#: Version of the trace's ``otherData`` block (bumped when its keys change meaning).
TIMELINE_SCHEMA = 1


@dataclass(frozen=True)
class DeepTrace:
    """Function-level events of one process, from a viztracer dump (``hooks/deep.py``).

    ``events``: viztracer's ``traceEvents``; ``viz_us``/``mono_ns``: one instant read on
    viztracer's clock (µs) and on CLOCK_MONOTONIC (ns) together, so the dump is placed on
    the host's aligned clock whatever viztracer's time base is.
    """

    host: str
    pid: int
    viz_us: float
    mono_ns: int
    events: Tuple[Dict[str, Any], ...]
    path: str = ""


def _mark(diag: Optional[Dict[str, Any]]) -> Optional[Mark]:
    if not diag or not diag.get("culprit_ranks"):
        return None
    return Mark(
        kind=str(diag.get("kind")),
        ranks=tuple(diag.get("culprit_ranks") or ()),
        group=diag.get("group"),
        seq=diag.get("seq"),
    )


def _deep_events(d: DeepTrace, track: Track, threads: Threads, clock: Clock, host: str) -> List[Event]:
    """viztracer events moved onto ``track``, clock-aligned, threads named ``deep: …``."""
    names: Dict[Any, str] = {}
    for e in d.events:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[e.get("tid")] = str((e.get("args") or {}).get("name"))
    shift_ns = d.mono_ns - d.viz_us * 1000.0
    out: List[Event] = []
    for e in d.events:
        if names.get(e.get("tid"), "").startswith("hangtrace-"):
            continue  # our own threads (the deep trace's watchdog writing the dump)
        ph = e.get("ph")
        if ph not in ("X", "i", "I", "B", "E", "C") or "ts" not in e:
            continue
        ev = dict(e)
        ev["ts"] = clock.mono_us(host, int(e["ts"] * 1000.0 + shift_ns))
        ev["pid"] = track.pid
        ev["tid"] = threads.tid("deep: %s" % names.get(e.get("tid"), e.get("tid")))
        ev["cat"] = "deep"
        out.append(ev)
    return out


def _span(snap: Snapshot, procs: Sequence[ProcessInfo], clock0: Clock) -> Tuple[int, int, Dict[str, int]]:
    """Processes (on the unshifted clock) in; (first wall ns, last wall ns, {key: track end ns}) out."""
    walls = [clock0.mono_to_wall(p.host, int(r["t_mono_ns"])) for p in procs for r in p.records[:1]]
    walls += [e["wall_ns"] for p in procs for e in p.events or () if isinstance(e.get("wall_ns"), int)]
    t_first = min(walls) if walls else (snap.taken_wall_ns or 0)
    ends = {p.key: end_wall_ns(p, clock0, snap.taken_wall_ns) for p in procs}
    t_last = max(list(ends.values()) + [snap.taken_wall_ns or 0, t_first])
    return t_first, t_last, ends


def _ranks_asked(tracks: Sequence[Track], asked: Optional[FrozenSet[int]]) -> Dict[str, Any]:
    """``--ranks`` against the ranks the run's processes hold: ``{'ranks_missing': [...],
    'ranks_held': [...]}`` (sorted ints) when no process holds some asked rank; {} else."""
    if asked is None:
        return {}
    held = sorted({t.rank for t in tracks if t.holds_rank})
    missing = sorted(asked - set(held))
    return {"ranks_missing": missing, "ranks_held": held} if missing else {}


def _keep_ranks(
    tracks: List[Track], by_key: Dict[str, Track], ranks: Optional[FrozenSet[int]]
) -> Tuple[List[Track], Dict[str, Track]]:
    """Tracks and {key: track} in; only those of ``ranks`` (all when None) out."""
    if ranks is None:
        return tracks, by_key
    # helpers of other ranks went with their rank
    keep = {t.pid for t in tracks if t.holds_rank and t.rank in ranks}
    return [t for t in tracks if t.pid in keep], {k: t for k, t in by_key.items() if t.pid in keep}


def _record_events(
    procs: Sequence[ProcessInfo],
    by_key: Dict[str, Track],
    threads: Dict[int, Threads],
    clock: Clock,
    window: Tuple[bool, int],
    ends: Dict[str, int],
    budget: Optional[int],
    mark: Optional[Mark],
) -> Tuple[List[Event], FlowRefs, int]:
    """Processes and their tracks in; (their record events, merged flow refs, records dropped) out.

    ``window``: (windowed, hi wall ns); ``budget``: records per process.
    """
    windowed, hi = window
    events: List[Event] = []
    refs: FlowRefs = {}
    dropped = 0
    for p in procs:
        t = by_key[p.key]
        helper = "" if t.members[0] == p.key else "helper %d: " % p.pid
        recs, n = win.select(p, clock, hi if windowed else None, budget)
        dropped += n
        rank = t.rank if not helper and t.holds_rank else -1
        pe = ProcessEvents(p, clock, t.pid, threads[t.pid], min(ends[p.key], hi), mark, helper, rank)
        ev, fl = pe.build(recs)
        events += ev
        for k, v in fl.items():
            refs.setdefault(k, []).extend(v)
    return events, refs, dropped


def _other_data(
    snap: Snapshot,
    diag: Dict[str, Any],
    opts: TimelineOptions,
    clock: Clock,
    counts: Tuple[int, int],
    sampling: Tuple[Optional[int], int, int],
    source: str,
) -> Dict[str, Any]:
    """The trace's ``otherData`` block; ``counts``: (processes, tracks); ``sampling``:
    (per-process record budget, records dropped, records total)."""
    per_proc_budget, dropped, total = sampling
    other = {
        "hangtrace_timeline": TIMELINE_SCHEMA,
        "t0_wall_ns": clock.t0_ns,
        "source": source,
        "snapshot_reason": snap.reason,
        "clock_offsets_ns": clock.offsets,
        "clock_alignment": "per host: median(t_wall_ns - t_mono_ns) over its records; hosts by wall clock; "
        "torch Flight Recorder times per process by its own pairs, else their own wall time",
        "processes": counts[0],
        "tracks": counts[1],
        "sampling": {
            "max_events": opts.max_events,
            "per_process_records": per_proc_budget,
            "records_dropped": dropped,
            "records_total": total,
        },
    }
    if diag:
        other["verdict"] = {
            k: diag.get(k)
            for k in (
                "kind",
                "culprit_ranks",
                "culprit_actors",
                "group",
                "seq",
                "op",
                "phase",
                "step",
                "summary",
            )
            if k in diag
        }
    return other


def build_timeline(
    snap: Snapshot,
    diagnosis: Optional[Dict[str, Any]] = None,
    deep: Sequence[DeepTrace] = (),
    options: TimelineOptions = TimelineOptions(),
    source: str = "",
) -> Dict[str, Any]:
    """The trace of ``snap`` as a JSON-ready dict ``{"traceEvents": [...], "otherData": {...}}``.

    ``diagnosis``: the stored ``diagnosis.json`` dict (verdict marks: culprit tracks named
    ``CULPRIT``, the verdict's collective named ``VERDICT <kind>: …``, a global instant at
    detection time and at the last progress); ``deep``: viztracer dumps merged into the
    tracks of their processes. Never raises on odd records; raises nothing of its own.
    """
    opts = options
    offsets = host_offsets(snap.processes)
    procs, notes = align_fr(snap.processes, offsets)
    clock0 = Clock(offsets, 0)
    t_first, t_last, ends = _span(snap, procs, clock0)
    lo, hi = win.bounds(opts, t_first, t_last)
    clock = Clock(offsets, lo)
    diag = diagnosis or {}
    slow = straggler_of(procs, diagnosis) or {}  # issue 43: its track is marked
    cr, ca = diag.get("culprit_ranks") or (), diag.get("culprit_actors") or ()
    tracks, by_key = assign_tracks(procs, cr, ca, slow.get("rank"))
    asked = _ranks_asked(tracks, opts.ranks)
    tracks, by_key = _keep_ranks(tracks, by_key, opts.ranks)
    procs = [p for p in procs if p.key in by_key]
    total = sum(len(p.records) for p in procs)
    per_proc_budget = opts.max_events // max(1, 2 * len(procs)) if total * 2 > opts.max_events else None
    threads = {t.pid: Threads(t.tid_base) for t in tracks}
    windowed = opts.since_s is not None or opts.until_s is not None
    events, refs, dropped = _record_events(
        procs, by_key, threads, clock, (windowed, hi), ends, per_proc_budget, _mark(diag)
    )
    for d in deep:
        dt = by_key.get("%s:%d" % (d.host, d.pid))
        if dt is not None:
            events += _deep_events(d, dt, threads[dt.pid], clock, d.host)
    events += _verdict_instants(snap, diag, clock)
    hi_us = clock.wall_us(hi)
    if windowed:
        events = win.clip(events, hi_us)
    if opts.flows:
        events += win.flows(refs, max(0, opts.max_events - len(events)), hi_us if windowed else None)
    meta = _metadata(tracks, threads)
    other = _other_data(
        snap, diag, opts, clock, (len(procs), len(tracks)), (per_proc_budget, dropped, total), source
    )
    if windowed:
        other["window_wall_ns"] = [lo, hi]
        other["run_wall_ns"] = [t_first, t_last]
        empty = win.empty_window(opts, lo, hi, t_first, t_last)
        if empty:
            other["window_empty"] = empty
        elif not events:
            other["window_note"] = "no event in this window (%.3f-%.3f s of the run's %.3f s)" % tuple(
                (t - t_first) / 1e9 for t in (lo, hi, t_last)
            )
    other.update(asked)
    if notes:
        other["errors"] = notes
    if slow:
        other["straggler"] = slow
    return {"traceEvents": meta + events, "displayTimeUnit": "ms", "otherData": other}


def _verdict_instants(snap: Snapshot, diag: Dict[str, Any], clock: Clock) -> List[Event]:
    out: List[Event] = []
    det = diag.get("details") or {}
    args = {
        "kind": diag.get("kind"),
        "culprit_ranks": diag.get("culprit_ranks"),
        "summary": diag.get("summary"),
    }
    if snap.reason in ("stall", "death") and snap.taken_wall_ns:
        out.append(
            {
                "ph": "i",
                "s": "g",
                "name": "%s detected" % snap.reason,
                "cat": "verdict",
                "ts": clock.wall_us(snap.taken_wall_ns),
                "pid": 0,
                "tid": 0,
                "args": args,
            }
        )
    elif snap.taken_wall_ns and diag:
        out.append(
            {
                "ph": "i",
                "s": "g",
                "name": "snapshot (%s)" % snap.reason,
                "cat": "verdict",
                "ts": clock.wall_us(snap.taken_wall_ns),
                "pid": 0,
                "tid": 0,
                "args": args,
            }
        )
    t = det.get("hang_start_wall_ns") or det.get("last_progress_wall_ns")
    if isinstance(t, int) and t > 0:
        out.append(
            {
                "ph": "i",
                "s": "g",
                "name": "last progress",
                "cat": "verdict",
                "ts": clock.wall_us(t),
                "pid": 0,
                "tid": 0,
                "args": {"note": "newest completed collective / phase / step of the run"},
            }
        )
    return out


def _metadata(tracks: List[Track], threads: Dict[int, Threads]) -> List[Event]:
    out: List[Event] = []
    for i, t in enumerate(tracks):
        out.append({"ph": "M", "name": "process_name", "pid": t.pid, "tid": 0, "args": {"name": t.name}})
        out.append(
            {"ph": "M", "name": "process_sort_index", "pid": t.pid, "tid": 0, "args": {"sort_index": i}}
        )
        if t.labels:
            out.append(
                {
                    "ph": "M",
                    "name": "process_labels",
                    "pid": t.pid,
                    "tid": 0,
                    "args": {"labels": ",".join(t.labels)},
                }
            )
        for tid, name in sorted(threads[t.pid].names.items()):
            out.append({"ph": "M", "name": "thread_name", "pid": t.pid, "tid": tid, "args": {"name": name}})
            order = 0 if name.endswith("steps") else (2 if name.startswith("deep:") else 1)
            out.append(
                {
                    "ph": "M",
                    "name": "thread_sort_index",
                    "pid": t.pid,
                    "tid": tid,
                    "args": {"sort_index": order * 1000 + tid % 1000},
                }
            )
    return out
