"""A culprit that waits for a batch from its DataLoader: what its workers do. Pure.

A rank stuck outside collectives in ``_MultiProcessingDataLoaderIter._next_data`` waits
for its DataLoader workers; its own stack (a poll on the result queue) says nothing of
why. The workers' stacks (rank helpers, taken with the rank's) do: an idle worker sits in
``_worker_loop`` at its index queue; one inside ``fetch`` (torch/utils/data/_utils/fetch.py)
runs the dataset's code, and its innermost frames there are where the batch is stuck.
Found by a blind job (tr_dl_fork_lock): a worker forked while another thread of the rank
held a ``threading.Lock`` blocks for ever on it in ``__getitem__``; the verdict named the
rank, "select() on sockets/files", and never the worker.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

from hangtrace.tracer.analyze.context import Ctx
from hangtrace.tracer.analyze.stuck.blocking import blocking_reason
from hangtrace.tracer.analyze.stuck.stacktree import frame_label, process_frames, threads_of
from hangtrace.tracer.diagnosis import Diagnosis, Kind
from hangtrace.tracer.snapshot import ProcessInfo

#: torch/utils/data/dataloader.py: the iterator's frames while it waits for a batch
_ITER_WAIT = frozenset({"_next_data", "_get_data", "_try_get_data"})
_DATA = "torch/utils/data/"


def _path(f: Mapping[str, Any]) -> str:
    return str(f.get("filename") or "").replace("\\", "/")


def _short(f: Mapping[str, Any]) -> str:
    return str(f.get("name") or "").rsplit(".", 1)[-1]  # py-spy qualifies: '_MapDatasetFetcher.fetch'


def waits_for_batch(frames: Sequence[Dict[str, Any]]) -> Optional[str]:
    """The iterator frame (label) when ``frames`` (innermost first) wait for a batch of
    a multi-process DataLoader, else None."""
    for f in frames:
        if _short(f) in _ITER_WAIT and _path(f).endswith(_DATA + "dataloader.py"):
            return frame_label(f)
    return None


def in_dataset(p: ProcessInfo) -> Optional[Dict[str, Any]]:
    """``{'pid', 'frames': [label] innermost first, 'reason' (a known blocking call or None),
    'threads' (not counting hangtrace's), 'active' (py-spy's flag)}`` when the worker
    ``p``'s main thread is inside ``fetch`` below user code (the dataset, its transforms,
    a collate_fn), else None (idle at its index queue, or no stack)."""
    frames, th = process_frames(p)  # (a worker killed in the job's teardown: its SIGTERM dump)
    frames = list(frames or [])
    at = next(
        (i for i, f in enumerate(frames) if _short(f) == "fetch" and _path(f).endswith("_utils/fetch.py")),
        None,
    )
    if at is None:
        return None
    user = [f for f in frames[:at] if _DATA not in _path(f)]
    if not user:
        return None
    theirs = [t for t in threads_of(p) or () if not str(t.get("thread_name") or "").startswith("hangtrace")]
    return {
        "pid": p.pid,
        "frames": [frame_label(f) for f in user[:3]],
        "threads": len(theirs),
        "reason": blocking_reason(user),
        "active": (th or {}).get("active"),
    }


def loader_workers(ctx: Ctx, d: Diagnosis) -> None:
    """For each culprit stuck outside collectives that waits for a DataLoader batch:
    ``details['loader_wait']`` (a sentence for the paragraph) and an evidence line naming
    its live workers inside the dataset, where, and - for a worker whose only thread is
    blocked in a plain Python line (a ``with lock:`` blocks in C) - the fork-inherited
    lock it may be. Never raises on odd data."""
    if d.kind == Kind.UNKNOWN and not d.culprit_ranks and "loader_wait" not in d.details:
        _every_rank(ctx, d)
    if d.kind != Kind.STUCK_OUTSIDE_COLLECTIVE or "loader_wait" in d.details:
        return
    for r in d.culprit_ranks[:4]:
        v = ctx.views.get(r)
        frames = process_frames(v.proc)[0] if v is not None else None
        where = waits_for_batch(frames) if frames else None
        if v is None or where is None:
            continue
        mine = [p for p in ctx.snap.processes if ctx.roles.helper_of.get(p.key) == r]
        workers = [p for p in mine if p.state in ("alive", "unknown") or threads_of(p)]
        stuck: List[Dict[str, Any]] = [w for w in (in_dataset(p) for p in workers) if w is not None]
        if not stuck:
            text = "rank %d waits for a batch from its DataLoader (%s); %s" % (
                r,
                where,
                "none of its %d live workers is inside the dataset" % len(workers)
                if workers
                else "its %d worker(s) were gone before their stacks were taken (no dump): where the batch was stuck is "
                "not known" % len(mine)
                if mine
                else "no live worker of it was traced",
            )
        else:
            w = stuck[0]
            lone = w["threads"] == 1 and not w["reason"] and w["active"] is False
            text = (
                "rank %d waits for a batch from its DataLoader (%s); its worker%s pid %s %s inside the dataset: %s%s"
                % (
                    r,
                    where,
                    "s" if len(stuck) > 1 else "",
                    ", ".join(str(x["pid"]) for x in stuck[:4]),
                    "are" if len(stuck) > 1 else "is",
                    " < ".join(w["frames"]),
                    " (%s)" % w["reason"]
                    if w["reason"]
                    else (
                        " (%s only thread, idle in C at that line: if the line takes a lock, one that another thread "
                        "of the rank held when the worker was forked is never released in the worker)"
                        % ("each one's" if len(stuck) > 1 else "its")
                        if lone
                        else ""
                    ),
                )
            )
        d.details["loader_wait"] = text
        ctx.add(text)
        return


def _every_rank(ctx: Ctx, d: Diagnosis) -> None:
    """Nothing progressed and no rank is in a collective: when every rank waits for a batch
    from its DataLoader, ``details['loader_wait']`` says so and what their workers do (blind
    helper 93: a slow first batch on a loaded machine gave "Unknown: nothing progressed but
    no rank is in a collective", every rank's stack in the DataLoader's poll)."""
    waits: Dict[int, str] = {}
    for r, v in ctx.views.items():
        frames = process_frames(v.proc)[0]
        where = waits_for_batch(frames) if frames else None
        if where is None:
            return
        waits[r] = where
    if not waits:
        return
    workers = [
        p
        for p in ctx.snap.processes
        if ctx.roles.helper_of.get(p.key) in waits and (p.state in ("alive", "unknown") or threads_of(p))
    ]
    stuck: List[Dict[str, Any]] = [w for w in (in_dataset(p) for p in workers) if w is not None]
    busy = bool(stuck) and all(w["active"] for w in stuck)
    text = "every rank waits for a batch from its DataLoader (%s); %s" % (
        next(iter(waits.values())),
        (
            "their worker%s pid %s %s inside the dataset: %s%s"
            % (
                "s" if len(stuck) > 1 else "",
                ", ".join(str(w["pid"]) for w in stuck[:6]),
                "are" if len(stuck) > 1 else "is",
                " < ".join(stuck[0]["frames"]),
                " (%s)" % stuck[0]["reason"]
                if stuck[0]["reason"]
                else ", running (py-spy: busy on the CPU): a slow batch, not a hang, if it comes in time (raise --stall-s)"
                if busy
                else "",
            )
        )
        if stuck
        else "none of their %d live workers is inside the dataset" % len(workers),
    )
    d.details["loader_wait"] = text
    ctx.add(text)
