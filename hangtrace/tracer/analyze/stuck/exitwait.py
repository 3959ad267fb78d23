"""A process whose program has returned but that does not exit: what its exit waits for. Pure.

When a Python program's main module returns, the interpreter first joins every
non-daemon thread (``threading._shutdown``, called by ``Py_FinalizeEx``; also by
multiprocessing's ``Process._bootstrap`` in its children), then runs the ``atexit``
handlers (multiprocessing joins its non-daemon children there, ``concurrent.futures``
its pool threads, logging and W&B-style clients flush). A thread that never ends (a
metrics uploader nobody stops) or a handler that blocks keeps the process alive after
its last record: the job "does not exit at the end", the other ranks have exited, and
nothing is in a collective. Found by a job of ours written from that incident
(2026-12-04): the verdict was "Unknown: nothing progressed but no rank is in a
collective", while the rank's stacks showed ``_shutdown (threading.py)`` and the
uploader in ``queue.get``.

Two sources, either enough:

- the ``exiting`` event (hooks/process/lifecycle.py wraps ``threading._shutdown``): the program
  returned, with the non-daemon threads alive at that moment (name, native id);
- the main thread's stack (py-spy or a faulthandler dump): its innermost frame is
  ``_shutdown`` in threading.py (called by the interpreter, or by multiprocessing's
  ``BaseProcess._bootstrap`` in a spawned or forked child: blind helper 56's
  ``torch.multiprocessing.spawn`` job); with the event, also an exit
  handler (an outermost frame that is not the program's ``<module>`` nor runpy's: the
  function atexit called; without the event such a stack may be cut or an embedder's).

What the exit waits for is said from the other threads' stacks: each non-daemon thread
(by the event; without it, every thread started by ``threading`` that is not ours) with
its blocking reason and the user's frame it is in.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple

from hangtrace.tracer.analyze.stuck.blocking import blocking_reason
from hangtrace.tracer.analyze.evidence import program_frames
from hangtrace.tracer.stackmodel.usercode import user_frame
from hangtrace.tracer.analyze.stuck.stacktree import frame_label, pick_thread, threads_of
from hangtrace.tracer.snapshot import ProcessInfo

#: outermost frames of a program still running its main code (``python -m``: runpy)
_PROGRAM_FILES = ("runpy.py", "<frozen runpy>")
_MAX_THREADS = 3


def _base(f: Dict[str, Any]) -> str:
    return os.path.basename(str(f.get("filename") or ""))


def exiting_event(p: ProcessInfo) -> Optional[Dict[str, Any]]:
    """The newest ``exiting`` event of ``p`` (hooks/process/lifecycle.py), or None."""
    return p.exiting


def _is(f: Dict[str, Any], base: str, name: str) -> bool:
    return _base(f) == base and str(f.get("name") or "").rsplit(".", 1)[-1] == name


def main_at_exit(frames: List[Dict[str, Any]]) -> Optional[str]:
    """How the main thread's frames (innermost first) are at exit: ``'executor'`` when
    ``concurrent.futures``' exit hook (``_python_exit``, registered with
    ``threading._register_atexit``, run inside ``threading._shutdown``) joins its pool's
    workers - daemon threads since Python 3.9, joined all the same (blind helper 57);
    ``'_shutdown'`` for the join of non-daemon threads (called by the interpreter, or by
    multiprocessing's ``BaseProcess._bootstrap`` in a child); ``'handler'`` when its
    outermost frame is an exit handler (neither ``<module>`` nor runpy's); else None."""
    if not frames:
        return None
    if any(_is(f, "threading.py", "_shutdown") for f in frames):
        return "executor" if any(_is(f, "thread.py", "_python_exit") for f in frames) else "_shutdown"
    outer = frames[-1]
    if (
        outer.get("name") == "<module>"
        or _base(outer) in _PROGRAM_FILES
        or str(outer.get("filename") or "").startswith("<frozen")
    ):
        return None
    return "handler"


def _started_thread(th: Dict[str, Any]) -> bool:
    fs = program_frames(th)
    return (
        bool(fs)
        and _base(fs[-1]) == "threading.py"
        and not str(th.get("thread_name") or "").startswith("hangtrace")
    )


def _thread_text(th: Dict[str, Any]) -> str:
    fs = program_frames(th)
    name = th.get("thread_name") or "thread %s" % th.get("os_thread_id")
    if not fs:
        return "'%s' (no stack)" % name
    why = blocking_reason(fs, thread=th)
    user = user_frame(fs)
    where = "in %s" % frame_label(user) if user is not None else "in %s" % frame_label(fs[0])
    if why and (user is None or frame_label(user) in why):  # (the reason names the line already)
        return "'%s': %s" % (name, why)
    if why:
        return "'%s', %s: %s" % (name, where, why)
    return "'%s', %s (running)" % (name, where)


def exit_wait_text(p: ProcessInfo) -> Optional[str]:
    """The text of :func:`exit_wait`, or None."""
    found = exit_wait(p)
    return found[1] if found else None


def exit_wait(p: ProcessInfo) -> Optional[Tuple[str, str]]:
    """``(how, text)``: how ``p`` is at exit (:func:`main_at_exit`'s word, ``'_shutdown'``
    from the event alone) and what its exit waits for, when its program has returned and it is still alive:
    ``"its program returned and the interpreter waits at exit for its non-daemon thread
    'metrics-uploader', in uploader (job.py:7): queue.get/put (...) in get (queue.py:171)"``;
    None when ``p`` is not at exit by its event or its main thread's stack, or is not alive."""
    if p.state not in ("alive", "unknown"):
        return None
    threads = [t for t in threads_of(p) or () if isinstance(t, dict)]
    main = pick_thread(threads)
    main = main if main is not None and main.get("thread_name") == "MainThread" else None
    ev = exiting_event(p)
    how = _how_at_exit(main, ev)
    if how is None:
        return None
    others = [t for t in threads if t is not main]
    started = sorted(
        [t for t in others if _started_thread(t)], key=lambda t: user_frame(program_frames(t)) is None
    )
    if how == "handler":
        return how, _handler_text(main, started)
    if how == "executor":
        return how, _executor_text(started)
    return how, _shutdown_text(ev, others, started)


def _how_at_exit(main: Optional[Dict[str, Any]], ev: Optional[Dict[str, Any]]) -> Optional[str]:
    """How the process is at exit from its main thread ``main`` and its ``exiting`` event ``ev``
    (:func:`main_at_exit`'s word, ``'_shutdown'`` from the event alone), or None when not at exit."""
    if program_frames(main):  # the stack is the truth: an event alone may be a forked child's inherited one
        how = main_at_exit(program_frames(main))
        if how is None or (how == "handler" and ev is None):
            return None  # (an outermost frame not the program's, without the event: a cut stack, an embedder)
        return how
    if ev is None:
        return None
    return "_shutdown"


def _handler_text(main: Optional[Dict[str, Any]], started: List[Dict[str, Any]]) -> str:
    """The text for a main thread ``main`` in an exit handler, with the ``started`` threads."""
    fs = program_frames(main)
    user = user_frame(fs)
    return "its program returned and the process is in an exit handler (atexit)%s: %s, in %s%s" % (
        " %s" % frame_label(user) if user is not None else "",
        blocking_reason(fs, thread=main) or "running",
        " < ".join(frame_label(f) for f in fs[:3]),
        _threads_clause("; its other thread", started),
    )


def _executor_text(started: List[Dict[str, Any]]) -> str:
    """The text for concurrent.futures' exit hook joining its workers (from the ``started`` threads)."""
    workers = [
        t for t in started if any(_is(f, "thread.py", "_worker") for f in program_frames(t))
    ] or started
    return (
        "its program returned and concurrent.futures' exit hook (_python_exit, run by threading._shutdown "
        "before any atexit handler) joins its ThreadPoolExecutor worker%s"
        % (_threads_clause("", workers) or "s (no stack of them)")
    )


def _shutdown_text(
    ev: Optional[Dict[str, Any]], others: List[Dict[str, Any]], started: List[Dict[str, Any]]
) -> str:
    """The text for the interpreter joining non-daemon threads: those of the event ``ev`` among
    the ``others`` (the ``started`` ones without the event)."""
    names = [str(t.get("name")) for t in (ev or {}).get("threads") or () if isinstance(t, dict)]
    ids = {t.get("native_id") for t in (ev or {}).get("threads") or () if isinstance(t, dict)}
    waited = (
        [t for t in others if t.get("os_thread_id") in ids or t.get("thread_name") in names]
        if ev is not None
        else started
    )
    if not waited and names:
        return (
            "its program returned and the interpreter waits at exit for its non-daemon thread(s) %s "
            "(no stack of them)" % ", ".join("'%s'" % n for n in names[:_MAX_THREADS])
        )
    if not waited:
        return "its program returned and the interpreter does not finish its exit (no other thread seen)"
    return (
        "its program returned and the interpreter waits at exit (threading._shutdown) for its %sthread%s"
        % ("non-daemon " if ev is not None else "", _threads_clause("", waited))
    )


def _threads_clause(lead: str, threads: List[Dict[str, Any]]) -> str:
    """``"s 'a', in f (x.py:3): ...; 'b', ..."`` (``lead`` before, plural 's' when more than
    one), at most ``_MAX_THREADS`` named; '' without threads."""
    if not threads:
        return ""
    text = "%s%s %s" % (
        lead,
        "s" if len(threads) > 1 else "",
        "; ".join(_thread_text(t) for t in threads[:_MAX_THREADS]),
    )
    return text + ("; and %d more" % (len(threads) - _MAX_THREADS) if len(threads) > _MAX_THREADS else "")
