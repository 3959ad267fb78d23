"""The thread that issued a rank's collectives has ended (pure; issue 37).

A rank whose training loop runs in a thread of its own (Ray Train V2 runs ``train_func`` in a
``TrainingThread``; a user's worker thread) lives on when that loop ends early: the process
goes back to what its main thread does (Ray's task loop, a server), its groups stay open, and
its peers hang in their next collective. Found by the blind job rt_skip_step (2026-12-07):
rank 1 skipped an all-padding batch, its loop ended two all-reduces short, and the verdict
was "stuck outside collectives ... epoll_wait in Worker.main_loop" about its main thread.

:func:`ended_thread` reads it from the rank's own records and its live stacks: the thread
its loop ran in (:func:`loop_thread`) is not among the threads of its py-spy stacks, which name their
threads, and its main thread runs none of the user's code (it idles in a library's loop:
Ray's task loop). A main thread in the user's code is what the rank waits in (a background
thread that issued a collective and ended says nothing then). Its main thread never counts
as the ended one.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from hangtrace.tracer.ring.frrecords import FR_SOURCE
from hangtrace.tracer.snapshot import ProcessInfo
from hangtrace.tracer.stackmodel.usercode import user_frame


def loop_thread(proc: ProcessInfo, last: Mapping[Any, Mapping[str, Any]]) -> Optional[str]:
    """The thread the rank's loop ran in, as ``threading`` named it: the thread of its newest
    collective record of ours (``last``: group -> newest collective, ``RankView.last``), else
    of its newest Ray wait (Ray Train's report waits in the training thread; DDP's
    all-reduces are Flight Recorder entries, named after torch's C++ thread); else None."""
    ours = [r for r in last.values() if r.get("source") != FR_SOURCE and r.get("thread")]
    if not ours and proc.summary is not None:
        ours = [r for r in proc.summary.waits.values() if r.get("thread")]
    if not ours:
        return None
    return str(max(ours, key=lambda r: int(r.get("t_wall_ns") or 0)).get("thread"))


def ended_thread(proc: ProcessInfo, last: Mapping[Any, Mapping[str, Any]]) -> Optional[str]:
    """:func:`loop_thread` when ``proc``'s live stacks (py-spy) name their threads, none has
    that name, and the main thread runs no user code; else None."""
    name = loop_thread(proc, last)
    if name is None or name == "MainThread" or not proc.stacks or proc.stack_source != "py-spy":
        return None
    threads = {str(t.get("thread_name") or ""): t for t in proc.stacks if isinstance(t, dict)}
    main = threads.get("MainThread")
    if name in threads or main is None:
        return None
    return None if user_frame(list(main.get("frames") or ())) is not None else name
