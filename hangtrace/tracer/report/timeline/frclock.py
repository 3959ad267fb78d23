"""torch's Flight Recorder times placed on the timeline's clock (pure).

In: the snapshot's processes (records from the ring and from torch's Flight Recorder,
``ring/frrecords.py``) and the hosts' offsets (``model.host_offsets``). Out: the same
processes with every record that came from the Flight Recorder alone (C++-issued
collectives: DDP's gradient all-reduce, FSDP, ...) given the monotonic times the timeline
places records by, and one note per entry that could not be placed.

Such a record carries torch's times only: ``t_wall_ns`` = the entry's ``time_created_ns``,
``fr_started_ns``/``fr_completed_ns`` (``time_discovered_*``), ``fr_duration_ms``; its
``t_mono_ns`` is 0 (no monotonic reading). Placed by that 0, every C++ collective landed at
the host's boot time, minus the uptime on the trace, and Perfetto dropped it (issue 41).
torch reads these times with ``c10::getTime()``: CLOCK_REALTIME on Linux, the steady clock
(CLOCK_MONOTONIC) on macOS and Windows (``c10/util/ApproximateClock.h``, torch 2.13, checked
here: a DDP rank's entries are within milliseconds of its own wall readings).

Alignment, per process: its offset ``wall - mono`` is the median over its own records and
lifecycle events (pairs read together by our recorder); a torch time ``T`` nearer that
process's wall readings than its monotonic ones is a wall time and becomes ``T - offset``,
else it is already monotonic. A process with no pair of its own (a rank known from a dump
alone) takes its host's offset; with none either, a wall time ``T`` is kept as it is and
the timeline places it at ``T`` (its host then has no offset: the record's own wall time),
and a monotonic one cannot be placed (left out, with a note).

Completion: ``fr_completed_ns`` when torch saw it (NCCL), else the start plus
``fr_duration_ms`` (NCCL with timing on), else unknown: gloo entries carry neither (torch
2.13 marks them ``retired`` when the work ends, with no time), so a completed gloo entry
is drawn at its launch with ``end_unknown`` set.
"""

from dataclasses import replace
from statistics import median
from typing import Any, Dict, List, Optional, Sequence, Tuple

from hangtrace.tracer.ring.frrecords import FR_JOINED_SOURCE, FR_SOURCE
from hangtrace.tracer.snapshot import ProcessInfo

#: torch times before this are not wall times (2001-09-09 in ns since the Unix epoch)
_WALL_FLOOR_NS = 1_000_000_000 * 1_000_000_000

#: why a completed or failed entry has no end (args.end_unknown of its slice)
END_UNKNOWN = (
    "torch's Flight Recorder keeps no completion time for this backend (gloo: the entry is only "
    "marked retired); drawn at its launch"
)


def clock_pairs(p: ProcessInfo) -> List[int]:
    """``wall - mono`` (ns) of every record and lifecycle event of ``p`` holding both readings."""
    out = []
    for r in p.records:
        if r.get("t_wall_ns") and r.get("t_mono_ns"):
            out.append(int(r["t_wall_ns"]) - int(r["t_mono_ns"]))
    for e in p.events or ():
        if isinstance(e.get("wall_ns"), int) and isinstance(e.get("mono_ns"), int):
            out.append(e["wall_ns"] - e["mono_ns"])
    return out


def process_offset(p: ProcessInfo) -> Optional[int]:
    """Median ``wall - mono`` (ns) of ``p``'s own readings, or None when it has none."""
    pairs = clock_pairs(p)
    return int(median(pairs)) if pairs else None


def to_mono(t_ns: int, offset: Optional[int], wall_ref: Optional[int]) -> Optional[int]:
    """A torch time ``t_ns`` as CLOCK_MONOTONIC ns of its process (module docstring).

    ``offset``: the process's ``wall - mono`` (None: unknown); ``wall_ref``: one of its wall
    readings (ns). With no offset a wall time is returned as it is (placed by its own wall
    time) and a monotonic one gives None (cannot be placed)."""
    if offset is None:
        return t_ns if t_ns >= _WALL_FLOOR_NS else None
    ref = wall_ref if wall_ref is not None else offset
    if abs(t_ns - ref) <= abs(t_ns - (ref - offset)):
        return t_ns - offset  # a wall time (CLOCK_REALTIME: Linux)
    return t_ns  # already monotonic (steady clock: macOS, Windows)


def _end(r: Dict[str, Any], start: int, offset: Optional[int], wall_ref: Optional[int]) -> Optional[int]:
    done = r.get("fr_completed_ns")
    if isinstance(done, int) and done > 0:
        end = to_mono(done, offset, wall_ref)
        if end is not None and end >= start:
            return end
    dur = r.get("fr_duration_ms")
    if isinstance(dur, (int, float)) and dur >= 0:
        began = r.get("fr_started_ns")
        s = to_mono(began, offset, wall_ref) if isinstance(began, int) and began > 0 else None
        return int((s if s is not None and s >= start else start) + dur * 1e6)
    return None


def _aligned(r: Dict[str, Any], offset: Optional[int], wall_ref: Optional[int]) -> Optional[Dict[str, Any]]:
    """A Flight-Recorder-only record with its times on the monotonic clock, or None."""
    start = to_mono(int(r.get("t_wall_ns") or 0), offset, wall_ref)
    if start is None:
        return None
    by = "C++ (torch's Flight Recorder only)"
    if r.get("within_op"):  # a further launch of one Python call (all_gather_object: two all_gathers)
        by = "inside %s (torch's Flight Recorder only)" % r["within_op"]
    out = dict(r, t_mono_ns=start, t_end_mono_ns=None, issued_by=by)
    out["thread"] = "C++ collectives (%s)" % (r.get("thread") or "thread ?")
    if r.get("state") != "issued":
        end = _end(r, start, offset, wall_ref)
        if end is None:
            out["end_unknown"] = END_UNKNOWN
        out["t_end_mono_ns"] = end
    return out


def _joined(r: Dict[str, Any], offset: Optional[int], wall_ref: Optional[int]) -> Dict[str, Any]:
    """Our record joined with its entry: our times; when torch saw it complete and our ring
    did not (the ring lags the Work), torch's completion time, else ``end_unknown``."""
    if r.get("state") == "issued" or r.get("t_end_mono_ns"):
        return r
    end = _end(r, int(r.get("t_mono_ns") or 0), offset, wall_ref)
    return dict(r, t_end_mono_ns=end) if end is not None else dict(r, end_unknown=END_UNKNOWN)


def align_process(p: ProcessInfo, host_offset: Optional[int]) -> Tuple[ProcessInfo, int]:
    """``p`` with its Flight Recorder records aligned; (process, records left out)."""
    if not any(r.get("source") in (FR_SOURCE, FR_JOINED_SOURCE) for r in p.records):
        return p, 0
    own = process_offset(p)
    offset = own if own is not None else host_offset
    walls = [int(r["t_wall_ns"]) for r in p.records if r.get("t_wall_ns") and r.get("t_mono_ns")]
    wall_ref = walls[-1] if walls else (p.start_wall_ns or None)
    out: List[Dict[str, Any]] = []
    lost = 0
    for r in p.records:
        src = r.get("source")
        if src == FR_SOURCE:
            a = _aligned(r, offset, wall_ref)
            if a is None:
                lost += 1
                continue
            out.append(a)
        elif src == FR_JOINED_SOURCE:
            out.append(_joined(r, offset, wall_ref))
        else:
            out.append(r)
    out.sort(key=lambda r: int(r.get("t_mono_ns") or 0))
    return replace(p, records=out), lost


def align_fr(
    procs: Sequence[ProcessInfo], host_offsets: Dict[str, int]
) -> Tuple[List[ProcessInfo], List[str]]:
    """Every process with its Flight Recorder records aligned (module docstring) and one
    note per process whose entries could not be placed."""
    out: List[ProcessInfo] = []
    notes: List[str] = []
    for p in procs:
        q, lost = align_process(p, host_offsets.get(p.host))
        out.append(q)
        if lost:
            notes.append(
                "%s: %d Flight Recorder entr%s on torch's monotonic clock and no reading of ours to "
                "align them with: left out of the timeline" % (p.key, lost, "y" if lost == 1 else "ies")
            )
    return out, notes
