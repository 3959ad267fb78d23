"""Exceptions a rank survived: the failures that change a rank's path without ending it.

A rank that raised and caught, or whose exception unwound a phase into a ``finally``
or ``__exit__`` that still issues collectives (torchtitan PR 1342: the teardown barrier
after an exception), a background thread that died, an asyncio task whose exception
nobody retrieved, a Ray actor method that raised: none of these ends the process, so no
death rule sees them, yet each explains why that rank took another path than its peers.

Sources in the flight record (all written by ``hooks/``):

* ``phase_exit`` records with state ``failed`` and an error text ``Type: message``
  (``tracer.phase`` and Ray actor methods record the exception that left the phase);
* events ``thread_exception`` (``threading.excepthook``), ``task_exception`` (an asyncio
  task's exception still unretrieved one loop iteration after it failed,
  ``hooks/process/failures.py``), and ``exception`` events with a ``caught_by`` field for
  processes that then lived on.

Pure functions of a ``ProcessInfo``; no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, List, Mapping, Optional, Sequence

from hangtrace.tracer.analyze.context import history
from hangtrace.tracer.analyze.evidence import traceback_frames
from hangtrace.tracer.analyze.stuck.stacktree import frame_label
from hangtrace.tracer.snapshot import ProcessInfo

_MAX_TEXT = 300  # characters of an exception text kept in an evidence line
#: how long before a hang (or a mismatch) an exception a process survived is read as its cause (ns)
RECENT_NS = 60_000_000_000


@dataclass(frozen=True)
class SurvivedException:
    """One exception the process lived on after.

    ``source``: 'phase' (it left phase ``where``), 'thread' (thread ``where`` died),
    'asyncio-task' (task ``where``), 'ray-method' (actor method ``where``), 'caught';
    ``wall_ns``: when (ns since the epoch, 0 when unknown); ``text``: 'Type: message'.
    """

    source: str
    where: Optional[str]
    text: str
    wall_ns: int
    step: Optional[int] = None
    raised_at: Optional[str] = None  # the innermost frame of its traceback, 'reward_fn (job.py:17)'

    def line(self) -> str:
        """Human evidence fragment, e.g. "AssertionError: ... left phase 'train' at step 3"."""
        text = self.text if len(self.text) <= _MAX_TEXT else self.text[:_MAX_TEXT] + "..."
        at = " at step %d" % self.step if self.step is not None else ""
        if self.source == "phase":
            return "%s left phase '%s'%s" % (text, self.where, at)
        raised = " at %s" % self.raised_at if self.raised_at else ""
        if self.source == "thread":
            return "thread '%s' died of %s%s%s" % (self.where, text, raised, at)
        if self.source == "asyncio-task":
            return "asyncio task %s raised %s%s%s and nobody retrieved it" % (
                ("'%s'" % self.where) if self.where else "",
                text,
                raised,
                at,
            )
        return "%s (caught%s)%s" % (text, " by %s" % self.where if self.where else "", at)


#: frames Python gives a comprehension, a generator expression or a lambda: named by the
#: function they are written in (blind helper 83: "died of ValueError ... at <listcomp>")
_ANONYMOUS = frozenset(("<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>", "<lambda>"))


def _raised_at(e: Mapping[str, Any]) -> Optional[str]:
    """The innermost frame of the event's traceback (``'reward_fn (job.py:17)'``; a
    comprehension's as ``'<listcomp> in parse_record (job.py:43)'``), or None."""
    frames = traceback_frames(e.get("traceback"))
    if not frames:
        return None
    inner = frames[0]
    outer = next((f for f in frames[1:] if f.get("name") not in _ANONYMOUS), None)
    if inner.get("name") in _ANONYMOUS and outer is not None:
        return frame_label(dict(inner, name="%s in %s" % (inner.get("name"), outer.get("name") or "?")))
    return frame_label(inner)


def swallowed_since(p: ProcessInfo, wall_ns: int) -> Optional[SurvivedException]:
    """The newest exception that ended an asyncio task nobody awaited or a thread of ``p``
    at or after ``wall_ns`` (a producer that died before its consumer stopped), or None."""
    xs = [x for x in since(survived(p), wall_ns) if x.source in ("asyncio-task", "thread")]
    return xs[-1] if xs else None


#: the C++ source position gloo puts in its messages: "[/…/gloo/transport/tcp/pair.cc:553] "
_SRC = re.compile(r"\[[^\]\s]+\.(?:cc|cpp|h):\d+\]\s*")


def short_error(text: Optional[str], limit: int = 160) -> str:
    """The first line of an error text without gloo's C++ source position and its "This is
    typically caused by ..." tail: ``'RuntimeError: Connection closed by peer [127.0.0.1]:33515'``."""
    first = _SRC.sub("", str(text or "").strip().split("\n")[0])
    return first.split(" This is typically")[0].rstrip(".")[:limit]


def _text(e: Mapping[str, Any]) -> str:
    return "%s: %s" % (e.get("type") or "Exception", str(e.get("message") or "").strip())


def survived(p: ProcessInfo, ray_actor: bool = False) -> List[SurvivedException]:
    """The exceptions ``p`` survived, oldest first. ``ray_actor``: name failed phases
    as actor methods (Ray actor methods are recorded as phases)."""
    out: List[SurvivedException] = []
    for rec in history(p):
        if rec.get("kind") == "phase_exit" and rec.get("state") == "failed" and rec.get("error"):
            out.append(
                SurvivedException(
                    "ray-method" if ray_actor else "phase",
                    rec.get("phase"),
                    str(rec.get("error")),
                    int(rec.get("t_wall_ns") or 0),
                    rec.get("step"),
                )
            )
    fatal = _fatal_exception(p)
    for e in p.events or ():
        if not isinstance(e, Mapping):
            continue
        kind = e.get("event")
        if kind == "thread_exception":
            out.append(
                SurvivedException(
                    "thread",
                    e.get("thread_name") or e.get("thread"),
                    _text(e),
                    int(e.get("wall_ns") or 0),
                    raised_at=_raised_at(e),
                )
            )
        elif kind == "task_exception":
            out.append(
                SurvivedException(
                    "asyncio-task",
                    e.get("coro") or e.get("task"),
                    _text(e),
                    int(e.get("wall_ns") or 0),
                    raised_at=_raised_at(e),
                )
            )
        elif kind == "exception" and e is not fatal:
            out.append(SurvivedException("caught", e.get("caught_by"), _text(e), int(e.get("wall_ns") or 0)))
    out.sort(key=lambda x: x.wall_ns)
    return out


def _fatal_exception(p: ProcessInfo) -> Optional[Mapping[str, Any]]:
    """The exception event that ended ``p`` (the last one, when it died), else None."""
    if not p.died:
        return None
    exc = [e for e in p.events or () if isinstance(e, Mapping) and e.get("event") == "exception"]
    return exc[-1] if exc else None


def since(items: Sequence[SurvivedException], wall_ns: int) -> List[SurvivedException]:
    """The items at or after ``wall_ns`` (those with unknown time are kept)."""
    return [x for x in items if not x.wall_ns or x.wall_ns >= wall_ns]
