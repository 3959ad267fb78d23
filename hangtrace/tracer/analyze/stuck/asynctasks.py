"""The await chain a rank's event loop is blocked in (issue 9, item 2; pure).

From ``ProcessInfo.asyncio_loops`` (the pending tasks of each running loop at snapshot
time, ``collect/asynciotasks.py``): per loop, the tasks no other pending task waits for
are roots; from each root the chain follows ``awaits_task`` to the task it waits for,
and so on, to a task that waits on a plain future (or nothing known). The longest chain
is the one named: every task on it with its coroutine, the innermost with its await
frames and the future it waits on.
"""

from __future__ import annotations

from typing import Dict, List, Optional

from hangtrace.tracer.snapshot import LoopTasks, PendingTask, ProcessInfo

MAX_CHAIN = 8


def _chain(root: PendingTask, by_name: Dict[str, PendingTask]) -> List[PendingTask]:
    out = [root]
    while out[-1].awaits_task and out[-1].awaits_task in by_name and len(out) < MAX_CHAIN:
        nxt = by_name[out[-1].awaits_task]
        if nxt in out:
            break  # tasks waiting on each other: stop at the repeat
        out.append(nxt)
    return out


def longest_chain(loop: LoopTasks) -> List[PendingTask]:
    """The longest chain of task waits of ``loop`` ([] without tasks)."""
    by_name = {t.name: t for t in loop.tasks}
    awaited = {t.awaits_task for t in loop.tasks if t.awaits_task}
    roots = [t for t in loop.tasks if t.name not in awaited] or list(loop.tasks)
    chains = [_chain(r, by_name) for r in roots]
    return max(chains, key=len) if chains else []


def _where(t: PendingTask) -> str:
    """Where task ``t`` awaits, innermost first (4 frames), without call-forwarding
    wrappers (``usercode.wrapper_frame``: our Ray method wrapper, Ray's tracing span)."""
    from hangtrace.tracer.stackmodel.usercode import wrapper_frame

    frames = [f for f in t.frames if not wrapper_frame({"filename": f[1], "name": f[0]})]
    if not frames:
        return t.coro
    outer = list(reversed(frames))[:4]
    return " <- ".join("%s (%s:%d)" % (func, path.rsplit("/", 1)[-1], line) for func, path, line in outer)


def describe(p: ProcessInfo) -> Optional[str]:
    """``asyncio event loop: task 'Task-1' (main) awaits task 'fetch' in ... awaiting <Future ...>``
    for the loop of ``p`` with the longest chain; None without a running loop's tasks."""
    chain = await_chain(p)
    return "asyncio event loop: " + chain if chain else None


def await_chain(p: ProcessInfo) -> Optional[str]:
    """``describe``'s text without its "asyncio event loop: " head, or None."""
    best: List[PendingTask] = []
    for lp in p.asyncio_loops:
        c = longest_chain(lp)
        if len(c) > len(best):
            best = c
    if not best:
        return None
    inner = best[-1]
    steps = ["task '%s' (%s)" % (t.name, t.coro) for t in best[:-1]]
    steps.append("task '%s' in %s" % (inner.name, _where(inner)))
    text = " awaits ".join(steps)
    if inner.awaits_future:
        text += ", awaiting %s" % inner.awaits_future[:120]
    n = sum(len(lp.tasks) for lp in p.asyncio_loops)
    others = [t for lp in p.asyncio_loops for t in lp.tasks if t not in best]
    if others:  # (the task that should wake the chain is often one of these: name where they wait)
        text += "; also pending (%d of %d tasks): %s" % (
            min(len(others), _MAX_OTHERS),
            n,
            "; ".join("task '%s' in %s" % (t.name, _where(t)) for t in others[:_MAX_OTHERS]),
        )
    return text


#: other pending tasks named beside the longest chain
_MAX_OTHERS = 2
