"""Returned actor methods: a Ray actor rank whose method returned while its peers still
needed it (pure).

A rank's program that returns exits its process (``departures.py``). A Ray actor's method
that returns does not: the actor goes back to Ray's task loop and waits for its next call,
its gloo connections stay open, and its peers hang in their next collective instead of
failing. Found by blind helper 95 (2026-12-04, verl-style trainers): a node agent SIGTERMed
one of three trainer actors; its graceful-stop handler set a flag, ``train()`` saved a
checkpoint and returned; the other two waited in all_reduce seq 361 for 60 s. The verdict was
"stuck outside collectives: rank 1 ... blocked in the system call epoll_wait ... in
Worker.main_loop", with advice to look for a queue, lock or IO it waits for.

:func:`returned_method` finds that rank: a Ray actor (its ring's ``ray_actor_id``) with no
phase open (``ProcessInfo.phase``), whose newest actor-method phase exited without an error
after its newest collective, entered before it (the method issued the collectives), and
whose main thread, when its stack is known, runs none of the user's code (idle in Ray's
loop). A SIGTERM it received inside that method (``signals['sigterm']``, the time its dump
was written) is named with its sender and the user's line it interrupted.
Times are ns since the epoch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, Optional

from hangtrace.tracer.analyze.evidence import frames_of, handled_sigterm, ts
from hangtrace.tracer.stackmodel.usercode import user_frame
from hangtrace.tracer.analyze.stuck.stacktree import frame_label
from hangtrace.tracer.stackmodel.faulthandler_text import parse_faulthandler_dumps

if TYPE_CHECKING:
    from hangtrace.tracer.analyze.context import Ctx


@dataclass(frozen=True)
class Returned:
    """A rank's actor method that returned after its last collective: ``method``
    ('TrainActor.train'), ``wall_ns`` (its phase-exit record), ``after`` (its newest
    collective: 'all_reduce seq 360 on group '0''), ``sigterm`` (the SIGTERM it received in
    the method, as words, or '')."""

    rank: int
    method: str
    wall_ns: int
    after: str
    sigterm: str

    def text(self) -> str:
        """The chain end's reason: what the rank did instead of the collective."""
        return (
            "its actor method %s returned at %s, after its %s, and the actor is idle in Ray's task loop%s"
            % (self.method, ts(self.wall_ns), self.after, "; it " + self.sigterm if self.sigterm else "")
        )

    def details(self) -> Dict[str, Any]:
        """``details['returned']`` of the verdict (docs/DIAGNOSIS.md)."""
        return {
            "rank": self.rank,
            "method": self.method,
            "wall_ns": self.wall_ns,
            "after": self.after,
            "sigterm": self.sigterm,
        }


def sigterm_site(sig: Any) -> str:
    """``'train (driver.py:48)'``: the user's innermost frame in the signalled thread of a
    SIGTERM dump (faulthandler's "Current thread"), '' when there is none."""
    dumps = parse_faulthandler_dumps(str((sig or {}).get("text") or ""))
    threads = dumps[0]["threads"] if dumps else []
    cur = next((t for t in threads if t.get("current")), None) or next(
        (t for t in threads if t.get("thread_name") == "MainThread"), None
    )
    f = user_frame((cur or {}).get("frames") or [])
    return frame_label(f) if f is not None else ""


def returned_method(ctx: Ctx, r: int) -> Optional[Returned]:
    """The actor method of rank ``r`` that returned while its peers still needed it
    (module docstring), or None."""
    v = ctx.views.get(r)
    if v is None or v.dead or v.proc.state != "alive" or v.proc.phase is not None:
        return None
    p = v.proc
    if not p.meta.get("ray_actor_id") or p.summary is None or not v.last:
        return None
    last = max(v.last.values(), key=lambda rec: int(rec.get("t_wall_ns") or 0))
    t_last = int(last.get("t_wall_ns") or 0)
    visits = [
        (int(ex.get("t_wall_ns") or 0), name, int(en.get("t_wall_ns") or 0), ex)
        for name, (en, ex) in p.summary.phase_visits.items()
        if en is not None and ex is not None
    ]
    if not visits:
        return None
    t_exit, name, t_enter, ex = max(visits)
    if ex.get("state") == "failed" or ex.get("error") or not (t_enter <= t_last <= t_exit):
        return None
    _labels, frames, _thread = frames_of(ctx, r)
    if frames and user_frame(frames) is not None:
        return None  # (running the user's code: not idle)
    sig = (p.signals or {}).get("sigterm")
    t_sig = int((sig or {}).get("wall_ns") or 0)
    words = handled_sigterm(sig, sigterm_site(sig), t_exit) if sig and t_enter <= t_sig <= t_exit else ""
    cls = p.meta.get("ray_actor_class")
    after = "%s seq %s on group '%s'" % (last.get("op"), last.get("seq"), last.get("group"))
    return Returned(r, "%s.%s" % (cls, name) if cls else name, t_exit, after, words)
