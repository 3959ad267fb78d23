"""A culprit blocked on a lock, and the other threads of its process blocked on locks (pure).

A rank stuck outside collectives whose main thread waits for a lock (``blocking.
c_lock_frame``: a futex under ``with x_lock:``; or ``threading``'s Python-level acquire)
is waiting for a thread that holds it. When another thread of the same process waits for
a lock too, the two most likely hold what the other takes: the shape of a lock-order
deadlock (thread A: ``with state_lock: ... with upload_lock:``; thread B the other way).
The stacks cannot tell which thread holds which lock (``threading.Lock`` keeps no owner),
so the verdict names the threads and the lines they wait at, and says "most likely".
Found on a job written from such an incident (2026-12-04): the verdict said only "blocked
in the system call futex ... in main (job.py:33)".
"""

from __future__ import annotations

import os
from typing import Optional

from hangtrace.tracer.analyze.stuck.blocking import c_lock_frame, code_text, held_text
from hangtrace.tracer.analyze.context import Ctx
from hangtrace.tracer.analyze.stuck.stacktree import Thread, _short, frame_label, pick_thread, python_frames
from hangtrace.tracer.diagnosis import Diagnosis, Kind
from hangtrace.tracer.snapshot import ProcessInfo

#: Python-level lock acquires (``threading.RLock`` in pure Python, ``multiprocessing``'s locks)
_PY_ACQUIRE = (("threading.py", "acquire"), ("synchronize.py", "acquire"), ("synchronize.py", "__enter__"))
_MAX_THREADS = 3


def _lock_wait(t: Thread) -> Optional[str]:
    """Where thread ``t`` waits for a lock (``'at f (x.py:3): `with l:`'``), or None."""
    frames = python_frames(t)
    if t.get("active") is not False or not frames:
        return None
    f = c_lock_frame(frames, t)
    if f is not None:
        return frame_label(f) + code_text(f) + held_text(frames)
    f = frames[0]
    if (os.path.basename(str(f.get("filename") or "")), _short(f.get("name"))) in _PY_ACQUIRE and len(
        frames
    ) > 1:
        return frame_label(frames[1]) + code_text(frames[1]) + held_text(frames)
    return None


def lock_wait_text(proc: ProcessInfo, who: str) -> Optional[str]:
    """``"rank 1's thread 'ckpt-uploader' waits for a lock too, at uploader (job.py:15):
    `with state_lock:`; ..."`` when ``proc``'s main thread waits for a lock and other
    threads of it do too (``who``: ``'rank 1'``, ``'pid 816'``); None otherwise."""
    main = pick_thread(proc.stacks)
    if main is None or _lock_wait(main) is None:
        return None
    others = []
    for t in proc.stacks or ():
        if t is main or not isinstance(t, dict) or str(t.get("thread_name") or "").startswith("hangtrace"):
            continue
        where = _lock_wait(t)
        if where:
            others.append("'%s' at %s" % (t.get("thread_name") or t.get("thread_id") or "?", where))
    if not others:
        return None
    return (
        "%s's thread%s %s wait%s for a lock too: %s of one process each waiting for a lock most "
        "likely hold what the other takes (a lock-order deadlock; the `with` blocks each is inside are what it "
        "holds; threading.Lock records no owner)"
        % (
            who,
            "s" if len(others) > 1 else "",
            "; ".join(others[:_MAX_THREADS]),
            "" if len(others) > 1 else "s",
            "threads" if len(others) > 1 else "two threads",
        )
    )


def lock_waits(ctx: Ctx, d: Diagnosis) -> None:
    """For the first culprit stuck outside collectives that waits for a lock while other
    threads of its process do too: ``details['lock_wait']`` (a sentence for the paragraph,
    also an evidence line). Never raises on odd data."""
    if d.kind != Kind.STUCK_OUTSIDE_COLLECTIVE or "lock_wait" in d.details:
        return
    for r in d.culprit_ranks[:4]:
        v = ctx.views.get(r)
        text = lock_wait_text(v.proc, "rank %d" % r) if v is not None else None
        if text:
            d.details["lock_wait"] = text
            ctx.add(text)
            return
    key = d.details.get("culprit_process")  # a Ray actor without a rank (rules actors, actor_waits)
    p = next((q for q in ctx.snap.processes if q.key == key), None) if d.culprit_actors and key else None
    text = lock_wait_text(p, "the actor") if p is not None else None  # (the paragraph names it just before)
    if text:
        d.details["lock_wait"] = text
        ctx.add(text)
