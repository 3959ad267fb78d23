"""The timeline's time window (``--since``/``--until``) and event budget, and its flow arrows
(pure).

In: processes, the clock, the options; trace events already built. Out: the window's
bounds in wall ns, each process's records inside it (within the budget), the events cut to
it, and the flow arrows between the slices left. Every source goes through ``clip``:
records, Flight Recorder entries, lifecycle and signal instants, memory counters, deep
traces and the verdict's instants. A slice crossing an edge is cut at it; an async slice
(``b``/``e``) is cut as a pair (a lone half would be an import error in Perfetto).
"""

from typing import Any, Dict, List, Optional, Sequence, Tuple

from hangtrace.tracer.report.timeline.model import Clock, Event, FlowRefs, TimelineOptions
from hangtrace.tracer.snapshot import ProcessInfo


def bounds(opts: TimelineOptions, t_first: int, t_last: int) -> Tuple[int, int]:
    """(lo, hi) wall ns of the window: ``since_s``/``until_s`` seconds from ``t_first`` (the
    first record), or back from ``t_last`` (the last) when negative; the run's span else."""
    lo, hi = t_first, t_last
    if opts.since_s is not None:
        lo = (t_first if opts.since_s >= 0 else t_last) + int(round(opts.since_s * 1e9))
    if opts.until_s is not None:  # (integers: a float of 1.8e18 ns is 256 ns coarse)
        hi = (t_first if opts.until_s >= 0 else t_last) + int(round(opts.until_s * 1e9))
    return max(lo, t_first), hi


def empty_window(opts: TimelineOptions, lo: int, hi: int, t_first: int, t_last: int) -> Optional[str]:
    """Why the window [``lo``, ``hi``] (wall ns, from :func:`bounds`) cannot hold anything of
    the run spanning [``t_first``, ``t_last``] (wall ns): it ends before it starts, starts
    after the run's last reading or ends before its first; None when it overlaps the run."""
    what = " ".join(
        "--%s %g" % (k, v) for k, v in (("since", opts.since_s), ("until", opts.until_s)) if v is not None
    )
    span = "the run spans %.1f s" % ((t_last - t_first) / 1e9)
    if lo > t_last:
        why = "it starts %.1f s after the run's last reading" % ((lo - t_last) / 1e9)
    elif hi < t_first:
        why = "it ends %.1f s before the run's first reading" % ((t_first - hi) / 1e9)
    elif hi < lo:
        why = "it ends %.1f s before it starts" % ((lo - hi) / 1e9)
    else:
        return None
    return "the window %s holds nothing: %s (%s)" % (what, why, span)


def select(
    p: ProcessInfo, clock: Clock, hi: Optional[int], quota: Optional[int]
) -> Tuple[List[Dict[str, Any]], int]:
    """Records of ``p`` up to ``hi`` (wall ns; None: no window); above ``quota`` only the
    newest (in-flight, failed and group records always kept; memory samples thinned to a
    quarter of the quota). Returns (records in their order, records dropped by the quota).

    With a window every record up to ``hi`` is drawn and ``clip`` cuts the events at its start:
    a phase, step or collective begun before ``lo`` shows from ``lo`` on, as it was then."""
    recs = (
        p.records
        if hi is None
        else [r for r in p.records if clock.mono_to_wall(p.host, int(r.get("t_mono_ns") or 0)) <= hi]
    )
    if quota is None or len(recs) <= quota:
        return recs, 0
    mem = [i for i, r in enumerate(recs) if r.get("kind") == "memory"]
    other = [i for i, r in enumerate(recs) if r.get("kind") != "memory"]
    keep_mem = mem[:: max(1, -(-len(mem) // max(1, quota // 4)))] if mem else []
    n_other = max(1, quota - len(keep_mem))
    newest = other[-n_other:]
    first = newest[0] if newest else 0
    pinned = [
        i
        for i in other[:-n_other]
        if recs[i].get("state") in ("issued", "failed") or recs[i].get("kind") == "group"
    ]
    kept = sorted(set(pinned + newest + [i for i in keep_mem if i >= first or not newest]))
    return [recs[i] for i in kept], len(recs) - len(kept)


def _clip_one(e: Event, hi_us: float) -> Optional[Event]:
    ts = e.get("ts", 0.0)
    if e["ph"] == "X":
        end = ts + e.get("dur", 0.0)
        if end < 0 or ts > hi_us:
            return None
        if ts < 0 or end > hi_us:
            e = dict(e, ts=max(ts, 0.0), dur=round(min(end, hi_us) - max(ts, 0.0), 3))
        return e
    return None if ts < 0 or ts > hi_us else e


def clip(events: Sequence[Event], hi_us: float) -> List[Event]:
    """Events inside [0, hi_us] (trace µs; 0 is the window's start); slices and async pairs
    crossing an edge are cut at it. Metadata (``M``) always kept."""
    span: Dict[Tuple[Any, Any, Any], List[float]] = {}
    for e in events:
        if e.get("ph") in ("b", "e"):
            k = (e.get("cat"), e.get("id"), e.get("pid"))
            se = span.setdefault(k, [e["ts"], e["ts"]])
            se[0 if e["ph"] == "b" else 1] = e["ts"]
    out: List[Event] = []
    for e in events:
        ph = e.get("ph")
        if ph == "M":
            out.append(e)
        elif ph in ("b", "e"):
            t0, t1 = span[(e.get("cat"), e.get("id"), e.get("pid"))]
            if t1 >= 0 and t0 <= hi_us:  # the pair overlaps the window: both halves kept, cut
                out.append(dict(e, ts=min(max(e["ts"], 0.0), hi_us)))
        else:
            c = _clip_one(e, hi_us)
            if c is not None:
                out.append(c)
    return out


def flows(refs: FlowRefs, budget: int, hi_us: Optional[float] = None) -> List[Event]:
    """Flow arrows (``s``/``t``/``f``) linking the slices of one (group, seq) across ranks,
    in issue order, at most ``budget`` events; with ``hi_us`` only slices that start inside
    [0, hi_us] (the window) are linked."""
    out: List[Event] = []
    fid = 0
    for key, lst in refs.items():
        if hi_us is not None:
            lst = [x for x in lst if 0 <= x[0] <= hi_us]
        if len(lst) < 2:
            continue
        if len(out) + len(lst) > budget:
            break
        fid += 1
        lst.sort()
        name = "%s %s #%s" % (key[0], key[1], key[-1])
        for i, (ts, pid, tid, rank) in enumerate(lst):
            ph = "s" if i == 0 else ("f" if i == len(lst) - 1 else "t")
            ev = {
                "ph": ph,
                "id": fid,
                "name": name,
                "cat": "flow",
                "ts": ts,
                "pid": pid,
                "tid": tid,
                "args": {"rank": rank, "arrival": i},
            }
            if ph != "s":
                ev["bp"] = "e"
            out.append(ev)
    return out
