"""Wording shared by the rules: rank lists, record descriptions, per-rank lines, the
culprit's frames, a SIGTERM a rank handled, and the common fields of a verdict (pure).

In: the analysis context (``context.Ctx``), records, frames (which are the user's:
``stackmodel/usercode.py``), wait-for instances. Out: evidence text, and the frames,
group, seq and phase of a ``Diagnosis``."""

from __future__ import annotations

import os

import time
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

from hangtrace.tracer.analyze.context import Ctx
from hangtrace.tracer.analyze.rankview import Record
from hangtrace.tracer.analyze.failures.departures import sent_by
from hangtrace.tracer.ring.frrecords import FR_JOINED_SOURCE, FR_SOURCE
from hangtrace.tracer.analyze.stuck.place import place_of
from hangtrace.tracer.analyze.stuck.stacktree import format_ranks, frame_label, process_frames, python_frames
from hangtrace.tracer.analyze.graph.waitgraph import Inst
from hangtrace.tracer.diagnosis import Diagnosis
from hangtrace.tracer.snapshot import ProcessInfo
from hangtrace.tracer.stackmodel.usercode import user_frame, wrapper_frame

MAX_FRAMES = 8


def rk(rs: Iterable[int], limit: int = 12) -> str:
    """'rank 3' / 'ranks 0-2,5' for a rank list."""
    rl = list(rs)
    return ("rank " if len(rl) == 1 else "ranks ") + format_ranks(rl, limit)


def vb(rs: Iterable[int], one: str = "waits", many: str = "wait") -> str:
    """The verb agreeing with the number of ranks."""
    return one if len(list(rs)) == 1 else many


def ts(wall_ns: Optional[int]) -> str:
    """ns since the epoch -> '2023-11-14T22:13:20.005Z' (UTC)."""
    if not wall_ns:
        return "?"
    sec, ns = divmod(int(wall_ns), 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec)) + ".%03dZ" % (ns // 1_000_000)


def desc_rec(rec: Record) -> str:
    """'all_reduce float32 numel=4 shape=[4] peer=1'."""
    s = "%s" % rec.get("op")
    if rec.get("dtype"):
        s += " %s" % rec.get("dtype")
    if rec.get("numel") is not None:
        s += " numel=%s" % rec.get("numel")
    if rec.get("shape"):
        s += " shape=%s" % rec.get("shape")
    if rec.get("peer") not in (None, -1):
        s += " peer=%s" % rec.get("peer")
    return s


def where_rec(rec: Record) -> str:
    """'step 3, phase train' of a record ('' when unknown)."""
    parts = []
    if rec.get("step") is not None:
        parts.append("step %s" % rec.get("step"))
    if rec.get("phase"):
        parts.append("phase %s" % rec.get("phase"))
    return ", ".join(parts)


def handled_sigterm(sig: Mapping[str, Any], at: str, returned_ns: int) -> str:
    """``"had received SIGTERM from pid N (...) at <time>, in train (job.py:48), and returned 0.1 s
    later: a SIGTERM handler ended its loop on this rank alone"``: the words for a rank (a
    program, or a Ray actor's method) that returned ``returned_ns`` after the SIGTERM dump
    ``sig``; ``at`` the user's line it interrupted ('' when unknown)."""
    t = int(sig.get("wall_ns") or 0)
    who = sent_by(sig)
    return (
        "had received SIGTERM%s%s%s, and returned %s: a SIGTERM handler ended its loop on this rank alone%s"
        % (
            who,
            " at %s" % ts(t) if t else "",
            ", in %s" % at if at else "",
            "%.1f s later" % ((returned_ns - t) / 1e9) if t else "after it",
            "" if who else " (its sender is not recorded)",
        )
    )


def program_frames(thread: Optional[Dict[str, Any]]) -> List[Any]:
    """A thread's Python frames (innermost first) without our own hooks' wrappers
    (:func:`wrapper_frame`: ``threading._shutdown`` and torch's calls are wrapped)."""
    return [f for f in python_frames(thread) if not wrapper_frame(f)]


def traceback_frames(text: Any) -> List[Any]:
    """The frames of the last traceback in ``text`` (Python's format, the exception that
    reached the top: a chained cause's frames come before it), innermost first, as
    ``{'name', 'filename', 'line'}`` dicts like a stack's; [] when there is none."""
    import re

    block = str(text or "").rsplit("Traceback (most recent call last):", 1)[-1]
    out = [
        {"name": m.group(3), "filename": m.group(1), "line": int(m.group(2))}
        for m in re.finditer(r'^\s*File "([^"]+)", line (\d+), in (\S+)', block, re.M)
    ]
    return out[::-1]


def frames_from_exception(d: Diagnosis, p: ProcessInfo) -> None:
    """A dead culprit without a stack: ``d.frames`` from its exception's traceback (where it
    raised, innermost first; ``details['frames_from'] = 'traceback'``) and the user's own
    frame (``details['user_frame']``) when the innermost three are a library's."""
    frames = traceback_frames((p.exception or {}).get("traceback"))
    if d.frames or not frames:
        return
    d.frames = [frame_label(f) for f in frames[:MAX_FRAMES]]
    d.details["frames_from"] = "traceback"
    user = user_frame(frames)
    if user is not None and frame_label(user) not in d.frames[:3]:
        d.details["user_frame"] = frame_label(user)
    _set_place(d, frames)


def _set_place(d: Diagnosis, frames: Optional[List[Any]]) -> None:
    """``details['place']``: the culprit's innermost frame of its own code and the library
    call it made there (``analyze/stuck/place.py``; issue 41), or no key without one."""
    place = place_of(frames)
    if place is None:
        d.details.pop("place", None)
    else:
        d.details["place"] = place


def frames_of(ctx: Ctx, r: int) -> Tuple[List[str], Optional[List[Any]], Optional[Dict[str, Any]]]:
    """(display labels, raw frames, thread dict) of rank ``r``'s analysed thread; the labels
    skip wrapper frames (``wrapper_frame``), so they start at the torch.distributed op
    or the blocking call and go on into the user's code."""
    p = ctx.procs.get(r)
    if p is None:
        return [], None, None
    frames, thread = process_frames(p)
    frames = frames or []
    shown = [f for f in frames if not wrapper_frame(f)] or frames
    return [frame_label(f) for f in shown[:MAX_FRAMES]], frames, thread


def torch_count(rec: Optional[Mapping[str, Any]]) -> bool:
    """The record's seq is torch's count (a Flight Recorder entry, or ours joined with one):
    C++-issued collectives such as DDP's gradient all-reduce included (ring/frrecords.py)."""
    return (rec or {}).get("source") in (FR_SOURCE, FR_JOINED_SOURCE)


def seq_scales(ctx: Ctx, r: int, g: Any, waiters: Iterable[int]) -> str:
    """``" (the waiters' seq is torch's count ...)"`` when the waiters' seq on ``g`` comes
    from their Flight Recorder and rank ``r``'s newest record there is hangtrace's count of
    Python calls (a rank with no Flight Recorder dump: dead, or holding the GIL), else ''.
    Found by a blind job: "rank 1: last all_reduce seq 23; rank 0 waits at seq 49"."""
    v = ctx.views.get(r)
    if v is None or torch_count(v.last.get(g)) or not any(torch_count(ctx.blocked(w)) for w in waiters):
        return ""
    return (
        " (the waiters' seq is torch's count, from the Flight Recorder: it counts C++-issued collectives such "
        "as DDP's gradient all-reduce; rank %d's is hangtrace's count of Python calls: the two do not "
        "compare)" % r
    )


def rank_line(ctx: Ctx, r: int, g: Any) -> str:
    """'rank 1: last all_reduce on group 'cp' seq 7 completed at step 3, phase train'."""
    v = ctx.views.get(r)
    if v is None:
        return "rank %d: no record file (state unknown)" % r
    rec = v.last.get(g)
    if rec is None:
        s = "rank %d: no collective on %s in its last %d records" % (r, ctx.gdesc(g), v.nrec)
    else:
        s = "rank %d: last %s on %s seq %s %s" % (
            r,
            rec.get("op"),
            ctx.gdesc(g),
            rec.get("seq"),
            rec.get("state"),
        )
        w = where_rec(rec)
        if w:
            s += " at " + w
    s += "; now %s" % v.proc.state
    if v.phase or v.step is not None:
        s += ", phase %s step %s" % (v.phase, v.step)
    return s


def stall_note(ctx: Ctx) -> Optional[str]:
    """How long ago anything progressed, against the stall threshold."""
    if ctx.age_s is None:
        return None
    return "last progress anywhere %.1f s before the snapshot%s" % (
        ctx.age_s,
        "" if ctx.stalled else " (below the %.0f s stall threshold: may still move)" % ctx.stall_s,
    )


def fill_common(ctx: Ctx, d: Diagnosis, culprits: Iterable[int], inst: Optional[Inst]) -> None:
    """Group/seq/op/phase/step/frames of the verdict from the main instance and culprit."""
    d.culprit_ranks = sorted(set(culprits))
    if inst is not None:
        d.group = inst.group
        d.group_ranks = list(ctx.members(inst.group)) or None
        d.details["group_desc"] = (ctx.groups.get(inst.group) or {}).get("desc")
        d.seq = inst.seq
        w = inst.waiters[0] if inst.waiters else None
        if w is not None:
            d.op = ctx.blocked(w).get("op")
    if d.culprit_ranks:
        c = d.culprit_ranks[0]
        v = ctx.views.get(c)
        if v is not None:
            d.phase, d.step = v.phase, v.step
            labels, raw, _a = frames_of(ctx, c)
            d.frames = labels
            user = user_frame(raw or [])
            if user is not None and frame_label(user) not in labels[:3]:
                d.details["user_frame"] = frame_label(user)
            _set_place(d, raw)
            if (
                raw
                and user is None
                and raw[0].get("name") == "main_loop"
                and str(raw[0].get("filename") or "").endswith(os.path.join("ray", "_private", "worker.py"))
            ):
                d.details["culprit_idle_in"] = "Ray's task loop"  # a Ray worker between tasks
