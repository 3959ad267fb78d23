"""Two threads of one rank issuing collectives on one process group (pure).

A rank's collectives on a group must come in the same order on every rank. When a
background thread (a metrics or logging thread, a weight pusher) issues collectives on a
group its main thread uses too, the two threads' collectives interleave by timing: one
rank's thread goes first, the other rank's main thread does, and the sequence numbers
pair an all_reduce of 8 elements with one of 1 (blind helper 67: gloo aborted, and the
verdict said "rank 0 issued all_reduce with a different size" with the main thread's
frames, although the records held ``thread=metrics-sync``).

In: the diagnosis of a mismatch (its group, culprits and signatures) and the context (each
rank's kept records, ``thread`` of each; its stacks). Out: ``details['group_threads']``
(``{'rank', 'threads', 'thread'}``: the threads that issued collectives on the group through
the Python API (not C++-issued ones only torch's Flight Recorder saw), and the one that
issued the culprit's record), the sentence ``details['group_threads_text']``,
an evidence line, and ``Diagnosis.frames`` from that thread's stack when it is not the
main thread (none when no stack of it was taken: the main thread's would point elsewhere). Never raises on odd data.
"""

from __future__ import annotations

from typing import Any, List, Mapping, Optional

from hangtrace.tracer.analyze.context import Ctx, history
from hangtrace.tracer.ring.frrecords import FR_SOURCE
from hangtrace.tracer.analyze.stuck.stacktree import frame_label, python_frames, threads_of
from hangtrace.tracer.analyze.stuck.place import place_of
from hangtrace.tracer.diagnosis import Diagnosis

_MAIN = "MainThread"


def issuing_threads(ctx: Ctx, r: int, group: Any) -> List[str]:
    """The names of the threads of rank ``r`` whose kept records are collectives on
    ``group``, main thread first, then in order of first use."""
    v = ctx.views.get(r)
    if v is None:
        return []
    seen: List[str] = []
    for rec in history(v.proc):
        if rec.get("kind") == "collective" and rec.get("group") == group and rec.get("source") != FR_SOURCE:
            t = str(rec.get("thread") or _MAIN)
            if t not in seen:
                seen.append(t)
    return sorted(seen, key=lambda t: (t != _MAIN, seen.index(t)))


def group_threads(ctx: Ctx, d: Diagnosis, crec: Optional[Mapping[str, Any]]) -> None:
    """Fills the outputs of the module docstring for the first culprit whose record at the
    mismatch came from a thread other than its main thread, or whose rank issued
    collectives on the group from several threads."""
    try:
        _group_threads(ctx, d, crec)
    except Exception:  # a detail: never lose the verdict for it
        return


def _group_threads(ctx: Ctx, d: Diagnosis, crec: Optional[Mapping[str, Any]]) -> None:
    if not d.culprit_ranks or d.group is None:
        return
    if (crec or {}).get("source") == FR_SOURCE:
        # issued in C++ (DDP's reducer on the autograd thread, a functional collective): only
        # torch's Flight Recorder saw it, and its thread is no Python thread of the program
        # (blind helper 82: "its thread 'python3'" for DDP's gradient all-reduce)
        return
    r = d.culprit_ranks[0]
    thread = str((crec or {}).get("thread") or _MAIN)
    threads = issuing_threads(ctx, r, d.group)
    if thread not in threads:
        threads.append(thread)
    if len(threads) < 2 and thread == _MAIN:
        return
    d.details["group_threads"] = {"rank": r, "threads": threads, "thread": thread}
    op = (crec or {}).get("op") or "collective"
    if len(threads) > 1:
        names = ", ".join("'%s'" % t if t != _MAIN else "its main thread" for t in threads[:4])
        text = (
            "rank %d issues collectives on %s from %d threads (%s); this %s came from %s: the threads' "
            "collectives interleave by timing, so the ranks pair different calls at one sequence number"
            % (
                r,
                ctx.gdesc(d.group),
                len(threads),
                names,
                op,
                "its thread '%s'" % thread if thread != _MAIN else "its main thread",
            )
        )
    else:
        text = (
            "rank %d's %s came from its thread '%s', not its main thread: check that no other thread issues "
            "collectives on %s on any rank" % (r, op, thread, ctx.gdesc(d.group))
        )
    d.details["group_threads_text"] = text
    ctx.add(text)
    if thread == _MAIN:
        return
    v = ctx.views.get(r)
    for t in (threads_of(v.proc) or ()) if v is not None else ():
        if isinstance(t, dict) and t.get("thread_name") == thread:
            fs = python_frames(t)
            if fs:  # the culprit's frames are the thread that issued the record, not the main thread
                d.frames = [frame_label(f) for f in fs[:8]]
                place = place_of(fs)
                if place is not None:
                    d.details["place"] = place
                else:
                    d.details.pop("place", None)
                return
    d.frames = []  # (no stack of that thread, e.g. it ended: another thread's frames would point elsewhere)
    d.details.pop("user_frame", None)
    d.details.pop("place", None)
