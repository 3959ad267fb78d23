"""Two stack samples of each process, taken a short interval apart (``hangtrace attach``,
issue 38): which processes moved, the odd one out among those that did not, and the
library call a stuck process waits in. Pure: ``ProcessInfo`` with ``stacks`` and
``earlier_stacks`` in, ranks and labels out.

One sample cannot tell a hung job from a training one (a healthy rank is caught in a
queue, its peers in backward); two can: a training job's stacks change between them, a
hung job's do not. A process *moved* when the analysed thread (``stacktree.pick_thread``)
shows other frames - function, file or line - in the later sample, or when it wanted CPU
(:data:`WORKING_SHARE`) between the samples.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from hangtrace.tracer.analyze.stuck.stacktree import classes, frame_label, merge_stacks, process_frames
from hangtrace.tracer.snapshot import ProcessInfo, ProgressWindow
from hangtrace.tracer.stackmodel.usercode import user_frame


def _key(frames: Optional[List[Any]]) -> Tuple[Tuple[Any, Any, Any], ...]:
    return tuple((f.get("name"), f.get("filename"), f.get("line")) for f in frames or ())


#: CPU demand (seconds per second) between the samples from which a process is working,
#: not waiting. Measured 2026-12-07 on the 2-core machine at load 25: training DDP ranks
#: 0.17-0.7, ranks blocked in ``Queue.get`` or in DDP's gradient all-reduce on gloo below
#: 0.08 even with the samples' own ptrace stops counted.
WORKING_SHARE = 0.15


def moved(procs: Mapping[int, ProcessInfo], window: Optional[ProgressWindow]) -> Tuple[List[int], List[int]]:
    """``(compared, moved)``: the keys of ``procs`` with both samples, and those that moved
    between them - the analysed thread's frames differ, or the process wanted at least
    :data:`WORKING_SHARE` of a CPU between them (``window.cpu_share``: a training rank
    is caught at the same blocking line twice often enough); both sorted."""
    cpu = dict(window.cpu_share) if window is not None else {}
    compared, out = [], []
    for k, p in sorted(procs.items()):
        if p.earlier_stacks is None or p.stacks is None or window is None:
            continue
        now, _ = process_frames(p)
        before, _ = process_frames(dataclasses.replace(p, stacks=p.earlier_stacks))
        if not now or not before:
            continue
        compared.append(k)
        if _key(now) != _key(before) or cpu.get(p.key, 0.0) >= WORKING_SHARE:
            out.append(k)
    return compared, out


def progressing(compared: Sequence[int], moving: Sequence[int]) -> bool:
    """The job works: most of the compared processes moved (one rank spinning while its
    peers wait is not progress)."""
    return bool(moving) and 2 * len(moving) > len(compared)


def library_call(frames: Sequence[Any]) -> Optional[str]:
    """``'Queue.get (queues.py:103), called from main (train.py:67)'``: the call the user's
    innermost frame made into a library (the frame just inside it), or None when the stack
    has no user frame or the user's frame is the innermost."""
    frames = list(frames)
    user = user_frame(frames)
    if user is None:
        return None
    i = next(i for i, f in enumerate(frames) if f is user)
    if i == 0:
        return None
    return "%s, called from %s" % (frame_label(frames[i - 1]), frame_label(user))


def odd_one_out(procs: Mapping[int, ProcessInfo], keys: Sequence[int]) -> Optional[List[int]]:
    """The keys among ``keys`` (processes whose stacks did not move) whose stack differs from
    the majority's: the ranks of the classes (``stacktree.classes``, by function) outside
    the one class that holds more than half of them, when those are fewer than half; else
    None (no majority, or nobody differs)."""
    if len(keys) < 3:
        return None
    cls = [c for c in classes(merge_stacks(procs[k] for k in keys)) if c["frames"] != ["<no stack>"]]
    if len(cls) < 2 or 2 * cls[0]["count"] <= len(keys):
        return None
    odd = sorted(r for c in cls[1:] for r in c["ranks"])
    return odd if 2 * len(odd) < len(keys) else None


def waits_in(frames: Sequence[Any]) -> str:
    """What a process whose stack did not move waits in, for the verdict: its library call
    (:func:`library_call`), else its innermost frame."""
    return library_call(frames) or (frame_label(frames[0]) if frames else "?")


def labels(frames_of: Mapping[int, Sequence[Any]], keys: Sequence[int]) -> Dict[int, str]:
    """{key: :func:`waits_in`} for ``keys``."""
    return {k: waits_in(frames_of.get(k) or ()) for k in keys}
