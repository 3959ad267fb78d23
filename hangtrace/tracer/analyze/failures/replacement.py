"""What the new process of a rank restarted alone does (``analyze/failures/lonerestart.py``). (pure)

In: the diagnosis and the context's ``replaced`` (rank -> (process that died, replacement)).
Out: ``details['replacement']`` for the first culprit restarted alone and an evidence line;
the paragraph adds a sentence and the advice says to restart the group together.
"""

from __future__ import annotations

from typing import Any, Dict

from hangtrace.tracer.analyze.stuck.blocking import blocking_reason, collective_frame, in_rendezvous_stack
from hangtrace.tracer.analyze.context import Ctx
from hangtrace.tracer.stackmodel.usercode import user_frame
from hangtrace.tracer.analyze.stuck.stacktree import frame_label, pick_thread, python_frames
from hangtrace.tracer.diagnosis import Diagnosis
from hangtrace.tracer.snapshot import ProcessInfo


def replacement_text(p: ProcessInfo) -> str:
    """What the replacement does: ``"pid 812 is in init_process_group (the rendezvous), called
    at Trainer.__init__ (driver.py:17)"``, or its innermost frames and blocking reason."""
    head = "pid %d" % p.pid
    if p.state in ("killed", "exited"):
        return "%s %s" % (head, "exited (code %s)" % p.exit_code if p.state == "exited" else "is gone too")
    th = pick_thread(p.stacks)
    frames = python_frames(th)
    if not frames:
        return "%s is alive (no stack%s)" % (head, ": %s" % p.stack_error if p.stack_error else "")
    mine = user_frame(list(frames))
    at = ", called at %s" % frame_label(mine) if mine is not None else ""
    if in_rendezvous_stack(p):
        return "%s is in init_process_group (the rendezvous)%s" % (head, at)
    coll = collective_frame(frames)
    if coll:
        return "%s is in %s%s" % (head, coll, at)
    why = blocking_reason(frames, thread=th)
    return "%s is in %s%s" % (
        head,
        " < ".join(frame_label(f) for f in frames[:3]),
        ": %s" % why if why else "",
    )


def replacement_detail(rank: int, p: ProcessInfo) -> Dict[str, Any]:
    """``details['replacement']``: ``{'rank', 'process' (host:pid), 'pid', 'start_wall_ns', 'text'}``."""
    return {
        "rank": rank,
        "process": p.key,
        "pid": p.pid,
        "start_wall_ns": p.start_wall_ns,
        "text": replacement_text(p),
    }


def replacement(ctx: Ctx, d: Diagnosis) -> None:
    """``details['replacement']`` and an evidence line when a culprit rank was restarted
    alone (its analysed process is the one that died)."""
    r = next((r for r in d.culprit_ranks or () if r in ctx.replaced), None)
    if r is None:
        return
    prev, new = ctx.replaced[r]
    det = d.details["replacement"] = replacement_detail(r, new)
    ctx.add(
        "rank %d was restarted alone: its process %s died and %s took the rank while the other ranks kept "
        "the process group %s was in: %s" % (r, prev.key, new.key, prev.key, det["text"])
    )
