"""Rule *stack_only* -> a verdict from stacks alone (``hangtrace attach``: a job not
started with hangtrace, so no flight records). Applies to snapshots whose reason is
'attach' and replaces every other rule for them.

Each rank's analysed thread is classified as *in a collective* (a torch.distributed
collective/p2p frame on its stack, which op) or *outside* (blocked in a queue, lock,
sleep, IO ... or simply not in torch.distributed). Then: ranks outside while others
wait in collectives -> 'stuck-outside-collective'; all in collectives but in different
ops -> 'collective-mismatch' naming the minority (every rank on a tie); ranks missing
(world size larger than the ranks found) while the others wait -> 'unknown' naming the
missing ranks; otherwise 'unknown' (all ranks in the same collective: the transport, or
a rank outside this host; or nobody in a collective). With two samples of each stack
taken a short interval apart (``Snapshot.window``, source 'stacks'; ``stuck/twosamples.py``):
a job whose stacks moved is 'progressing' (a single sample catches a training rank in a
queue while its peers are in backward), and when nobody is in a collective and nothing
moved, the rank whose stack differs from the majority's (waiting in ``Queue.get`` while
the others wait in backward) is 'stuck-outside-collective', with the library call it
waits in and its user frame in the headline. The summary is written here
(stacks-only wording), not by ``report.paragraph``.

When no process has a rank (attach found them through a child that inherited torch
variables they set in Python: ``collect/discover.py``), the same view is keyed by pid and
says "pid"; its culprits and waiters go to ``details['culprit_pids']`` and
``details['waiting_pids']``, never into the rank lists.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

from hangtrace.tracer.analyze.stuck.childwait import child_wait_text
from hangtrace.tracer.analyze.stuck.exitwait import exit_wait
from hangtrace.tracer.analyze.stuck.peerwait import peer_wait
from hangtrace.tracer.analyze.stuck.twosamples import labels, moved, odd_one_out, progressing, waits_in
from hangtrace.tracer.analyze.context import MAX_MISSING_LISTED, MAX_WORLD, Ctx
from hangtrace.tracer.analyze.stuck.lockwait import lock_wait_text
from hangtrace.tracer.analyze.rules.base import Finding
from hangtrace.tracer.analyze.stuck.blocking import blocking_reason, collective_frame
from hangtrace.tracer.stackmodel.usercode import user_frame
from hangtrace.tracer.analyze.stuck.stacktree import (
    classes,
    format_ranks,
    frame_label,
    merge_stacks,
    process_frames,
)
from hangtrace.tracer.diagnosis import Diagnosis, Kind
from hangtrace.tracer.snapshot import ProcessInfo
from hangtrace.tracer.report.advice import CHILD_NEXT, EXIT_NEXT, EXIT_NEXTS, LOCK_NEXT, peer_next

NAME = "stack_only"
#: ``Snapshot.reason`` of a stacks-only snapshot (written by ``collect/attach.py``)
REASON = "attach"


@dataclass(frozen=True)
class StackView:
    """Ranks by what their stacks show: ``inside``: rank -> collective op; ``outside``:
    rank -> why it is not in one; ``frames``: rank -> frames (innermost first)."""

    inside: Mapping[int, str]
    outside: Mapping[int, str]
    nostack: Tuple[int, ...]
    missing: Tuple[int, ...]
    world: int
    classes: Tuple[Dict[str, Any], ...]
    frames: Mapping[int, List[Any]]
    unit: str = "rank"  # what the keys are: 'rank', or 'pid' when no process has a rank
    procs: Mapping[int, ProcessInfo] = dataclasses.field(default_factory=dict)  # key -> its process
    at_exit: Mapping[int, str] = dataclasses.field(default_factory=dict)  # key -> what its exit waits for
    exit_how: Mapping[int, str] = dataclasses.field(
        default_factory=dict
    )  # key -> exitwait.main_at_exit's word
    window_s: float = 0.0  # seconds between the two stack samples (0: one sample)
    compared: Tuple[int, ...] = ()  # keys with both samples
    moving: Tuple[int, ...] = ()  # keys whose stack moved between them (stuck/twosamples.py)


def applies(ctx: Ctx) -> bool:
    """True for a stacks-only snapshot."""
    return ctx.snap.reason == REASON


def find(ctx: Ctx) -> Optional[Finding]:
    """The stack view of every rank (``data``: StackView) for a stacks-only snapshot."""
    if not applies(ctx):
        return None
    procs = [p for p in ctx.snap.processes if p.rank >= 0]
    unit = "rank"
    if len({p.rank for p in procs}) < len(procs):
        procs = []  # several processes claim one rank (spawn children that inherited RANK=0): not ranks
    if not procs:  # no rank known: the processes by pid (their stacks still tell who waits)
        procs = [dataclasses.replace(p, rank=p.pid, world_size=-1) for p in ctx.snap.processes if p.stacks]
        unit = "pid"
    inside: Dict[int, str] = {}
    outside: Dict[int, str] = {}
    nostack: List[int] = []
    frames_of: Dict[int, List[Any]] = {}
    at_exit: Dict[int, str] = {}
    exit_how: Dict[int, str] = {}
    for p in procs:
        frames, thread = process_frames(p)
        if not frames:
            nostack.append(p.rank)
            continue
        frames_of[p.rank] = frames
        cf = collective_frame(frames)
        if cf:
            inside[p.rank] = cf.split(" ")[0]
        else:
            ew = exit_wait(p)  # (its program returned: the main thread in threading._shutdown)
            if ew:
                exit_how[p.rank], at_exit[p.rank] = ew
            outside[p.rank] = (
                at_exit.get(p.rank) or blocking_reason(frames, thread=thread) or "not in torch.distributed"
            )
    world = max([p.world_size for p in procs if p.world_size and p.world_size <= MAX_WORLD] or [-1])
    have = {p.rank for p in procs}
    missing: List[int] = []
    for r in range(world if world > 0 else 0):  # bounded: world <= MAX_WORLD, <= 65536 listed
        if r not in have:
            missing.append(r)
            if len(missing) >= MAX_MISSING_LISTED:
                break
    w = ctx.snap.window
    compared, moving = (
        moved({p.rank: p for p in procs}, w) if w is not None and w.source == "stacks" else ([], [])
    )
    sv = StackView(
        inside,
        outside,
        tuple(nostack),
        tuple(missing),
        world,
        tuple(classes(merge_stacks(procs))),
        frames_of,
        unit,
        {p.rank: p for p in procs},
        at_exit,
        exit_how,
        w.window_s if w is not None and compared else 0.0,
        tuple(compared),
        tuple(moving),
    )
    return Finding(NAME, data=sv)


def _top(sv: StackView, rank: int) -> List[str]:
    return [
        "%s (%s:%s)" % (f.get("name"), os.path.basename(f.get("filename") or ""), f.get("line"))
        for f in sv.frames.get(rank, [])[:8]
    ]


def _user_beyond(sv: StackView, key: int) -> Optional[str]:
    """The user's own frame of ``key``'s stack when it is further out than the innermost
    four (``'fetch_version (job.py:78)'``: blind helper 58, whose attach verdict ended at
    urllib's frames), else None."""
    raw = sv.frames.get(key) or []
    user = user_frame(raw)
    return frame_label(user) if user is not None and user not in raw[:4] else None


def _stack_text(frames: List[str], user: Optional[str]) -> str:
    """The innermost four ``frames``, then ``user`` (:func:`_user_beyond`) after ``< ... <``."""
    return " < ".join(frames[:4]) + (" < ... < %s" % user if user else "")


def _n(sv: StackView, keys: Any) -> str:
    """``'rank'``/``'ranks'`` (or pid) for ``keys``."""
    return sv.unit + ("s" if len(keys) > 1 else "")


def still_text(sv: StackView) -> str:
    """``' (rank 1 did not)'``: the compared keys that did not move, or ''."""
    still = [k for k in sv.compared if k not in sv.moving]
    return " (%s %s did not)" % (_n(sv, still), format_ranks(still)) if still else ""


def _stuck(ctx: Ctx, sv: StackView, d: Diagnosis) -> None:
    inside, outside = sv.inside, sv.outside
    d.kind = Kind.STUCK_OUTSIDE_COLLECTIVE
    d.culprit_ranks = sorted(outside)
    d.waiting_ranks = sorted(inside)
    first = d.culprit_ranks[0]
    d.frames = _top(sv, first)
    ops = sorted(set(inside.values()))
    d.op = ops[0] if len(ops) == 1 else None
    who, p = "%s %d" % (sv.unit, first), sv.procs[first]
    child = child_wait_text(p, ctx.snap.processes, who)  # (what the first culprit waits for)
    lock = None if child else lock_wait_text(p, who)
    if child:
        d.details["child_wait"] = child
        d.evidence.append(child)
    elif lock:
        d.details["lock_wait"] = lock
        d.evidence.append(lock)
    note = child or lock
    why = outside[first]
    keys = {q.pid: k for k, q in sv.procs.items()}
    pw = peer_wait(
        why,
        p.host,
        list(sv.procs.values()),
        lambda q: "rank %d" % keys[q.pid] if sv.unit == "rank" else "a process of this job",
    )
    if pw is not None:  # (the socket's other end is one of the processes attached to)
        why = pw["reason"]
        if pw["peer"] and not note:
            note = d.details["peer_wait"] = pw["peer"]
            d.details["peer_role"] = pw["role"]
            d.evidence.append(note)
    user = _user_beyond(sv, first)
    if user:
        d.details["user_frame"] = user
    d.summary = (
        "Stuck outside collectives: %s %s %s not in any torch.distributed call (%s) while "
        "%s %s %s in %s. Its stack: %s.%s Next: %s."
        % (
            _n(sv, outside),
            format_ranks(outside),
            "are" if len(outside) > 1 else "is",
            why,
            _n(sv, inside),
            format_ranks(inside),
            "wait" if len(inside) > 1 else "waits",
            "/".join(ops),
            _stack_text(d.frames, user),
            " %s%s." % (note[:1].upper(), note[1:]) if note else "",
            CHILD_NEXT.replace("the rank", "the rank" if sv.unit == "rank" else "the process", 1)
            if child
            else LOCK_NEXT
            if lock
            else peer_next(str(d.details.get("peer_role"))).replace("the rank", "it", 1)
            if d.details.get("peer_wait")
            else "find what it waits for outside torch.distributed (the "
            "producer of its queue, the holder of its lock, its IO)",
        )
    )


def _mismatch(sv: StackView, d: Diagnosis) -> None:
    inside = sv.inside
    by_op: Dict[str, List[int]] = {}
    for r, op in inside.items():
        by_op.setdefault(op, []).append(r)
    ranked = sorted(by_op.items(), key=lambda kv: len(kv[1]))
    if len(ranked[0][1]) < len(ranked[-1][1]):
        d.culprit_ranks = sorted(ranked[0][1])
    else:
        d.culprit_ranks = sorted(inside)
    d.kind = Kind.COLLECTIVE_MISMATCH
    d.details["signatures"] = [
        {"op": op, "dtype": None, "numel": None, "ranks": sorted(rs)} for op, rs in ranked
    ]
    d.waiting_ranks = sorted(set(inside) - set(d.culprit_ranks))
    d.frames = _top(sv, d.culprit_ranks[0])
    d.summary = (
        "Collective mismatch: %ss are blocked in different collectives (%s). The odd one%s: "
        "%s %s. Its stack: %s. Next: compare the code paths; a %s took a different branch."
        % (
            sv.unit,
            "; ".join("%s: %ss %s" % (op, sv.unit, format_ranks(rs)) for op, rs in ranked),
            "s" if len(d.culprit_ranks) > 1 else "",
            _n(sv, d.culprit_ranks),
            format_ranks(d.culprit_ranks),
            " < ".join(d.frames[:4]),
            sv.unit,
        )
    )


def _progressing(sv: StackView, d: Diagnosis) -> None:
    """Most processes moved between the two samples: a working job."""
    d.kind = Kind.PROGRESSING
    d.details["moved"] = list(sv.moving)
    d.summary = (
        "Progressing: %s %s moved (other frames, or working on a CPU) in the %.1f s between two stack "
        "samples%s: the job is working, not hung. Next: nothing to fix yet; attach again later if it "
        "still seems stuck." % (_n(sv, sv.moving), format_ranks(sv.moving), sv.window_s, still_text(sv))
    )


def _odd_one(ctx: Ctx, sv: StackView, odd: List[int], d: Diagnosis) -> None:
    """Nothing moved, nobody in a collective, ``odd`` differ from the majority: stuck, with
    the library call each waits in (the others' in place of a collective)."""
    others = [k for k in sv.compared if k not in odd]
    why = {k: "it waits in %s; %s" % (waits_in(sv.frames[k]), sv.outside.get(k, "?")) for k in odd}
    _stuck(ctx, dataclasses.replace(sv, inside=labels(sv.frames, others), outside=why), d)
    d.op = None
    d.details["still_for_s"] = sv.window_s
    d.evidence.append("no %s's stack moved in the %.1f s between two samples" % (sv.unit, sv.window_s))


def explain(ctx: Ctx, finding: Finding, d: Diagnosis) -> None:
    """The whole stacks-only Diagnosis, summary included (``details['source']``)."""
    sv: StackView = finding.data
    inside, outside, missing = sv.inside, sv.outside, list(sv.missing)
    d.kind = Kind.UNKNOWN
    d.stack_classes = list(sv.classes)
    d.details["source"] = "stacks only (hangtrace attach: no flight records)"
    ev = d.evidence
    for c in sv.classes:
        ev.append("%ss %s: %s" % (sv.unit, format_ranks(c["ranks"]), " > ".join(c["frames"][-4:])))
    if missing:
        ev.append(
            "ranks %s of world size %d were not found on this host (dead, or on another node)"
            % (format_ranks(missing), sv.world)
        )
    if sv.nostack:
        ev.append("%ss %s: no stack (see errors)" % (sv.unit, format_ranks(sv.nostack)))
    odd = odd_one_out(sv.procs, [k for k in sv.compared if k not in sv.moving]) if sv.window_s else None
    if sv.window_s and progressing(sv.compared, sv.moving):
        _progressing(sv, d)
    elif inside and outside:
        _stuck(ctx, sv, d)
    elif not inside and odd:  # nobody in a collective: the one whose stack differs (issue 38)
        _odd_one(ctx, sv, odd, d)
    elif inside and len(set(inside.values())) > 1:
        _mismatch(sv, d)
    elif inside and missing:
        d.culprit_ranks = missing
        d.waiting_ranks = sorted(inside)
        d.summary = (
            "Ranks %s wait in %s; ranks %s were not found on this host: they died or run on another "
            "node. Next: attach on the other nodes, or check those ranks' logs for a crash."
            % (format_ranks(inside), "/".join(sorted(set(inside.values()))), format_ranks(missing))
        )
    elif inside:
        d.waiting_ranks = sorted(inside)
        d.summary = (
            "Unknown: every rank found waits in the same collective (%s) with the same stack; stacks "
            "alone cannot tell who is late. Next: run the job with HANGTRACE=1 for sequence numbers, "
            "or check the transport (NCCL/gloo logs)." % "/".join(sorted(set(inside.values())))
        )
    elif sv.at_exit:  # the job does not exit at the end (analyze/stuck/exitwait.py)
        d.kind, d.culprit_ranks = Kind.STUCK_OUTSIDE_COLLECTIVE, sorted(sv.at_exit)
        d.details["exit_wait"] = {str(k): t for k, t in sv.at_exit.items()}
        d.details["exit_how"] = sv.exit_how.get(d.culprit_ranks[0])
        d.frames = _top(sv, d.culprit_ranks[0])
        d.summary = "Stuck at exit (in no collective): %s.%s Next: %s." % (
            "; ".join(
                "%s %d's %s" % (sv.unit, k, t[4:] if t.startswith("its ") else t)
                for k, t in list(sv.at_exit.items())[:3]
            ),
            " %s %s %s not found on this host (exited, or on another node)."
            % (_n(sv, missing).capitalize(), format_ranks(missing), "were" if len(missing) > 1 else "was")
            if missing
            else "",
            EXIT_NEXTS.get(str(sv.exit_how.get(d.culprit_ranks[0])), EXIT_NEXT),
        )
    else:
        d.summary = (
            "Unknown: no %s is inside a torch.distributed collective%s. Next: look at the stack "
            "classes below; the job may be busy, not hung."
            % (sv.unit, " (%ss %s have no stack)" % (sv.unit, format_ranks(sv.nostack)) if sv.nostack else "")
        )
    if sv.unit == "pid":  # keys are pids: never in the rank lists
        d.details["culprit_pids"], d.details["waiting_pids"] = d.culprit_ranks, d.waiting_ranks
        d.culprit_ranks, d.waiting_ranks = [], []
        why = (
            "see errors"
            if d.errors
            else (
                "several claim the same RANK"
                if any(p.rank >= 0 for p in ctx.snap.processes)
                else "no RANK in their environment"
            )
        )
        d.summary = "Rank unknown for every process (%s); by pid: %s" % (why, d.summary)
