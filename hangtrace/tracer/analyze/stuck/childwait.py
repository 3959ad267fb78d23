"""A culprit that waits for a child process: which child, and what that child does. Pure.

A rank stuck outside collectives in ``subprocess.run``/``communicate``/``wait`` (or in
multiprocessing's ``Process.join``, or in ``wait4`` by the kernel's word) is waiting for a
child; its own stack (a select on the child's pipes) says nothing of why. The child's
stack does when the child is traced (a Python child of a traced process inherits
``HANGTRACE=1``): its innermost frames, and the call it is blocked in. Found by a blind
job (an evaluator started with ``subprocess.run(..., capture_output=True)`` by rank 0
hung in a socket ``recv``): the verdict said "select() on sockets/files" and never named
the evaluator, whose stack was in the snapshot.

Which children: live traced processes whose recorded parent pid is the culprit's. When
the kernel says the culprit waits for one pid (``wait4(pid N)``), that one; else those
started with a command line of their own (a ``Popen``: not a fork of the rank, such as
its DataLoader workers), else every child that is not an idle DataLoader worker. No traced
child: the children seen when its stacks were taken (``ProcessInfo.children``: pid,
command line, and the system call the kernel says each waits in), by the same narrowing;
a shell tool run by ``subprocess.check_call`` is named with what it is blocked on.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from hangtrace.tracer.analyze.stuck import peerwait
from hangtrace.tracer.analyze.context import Ctx
from hangtrace.tracer.analyze.stuck.blocking import blocking_reason, kernel_text, subprocess_wait
from hangtrace.tracer.stackmodel.usercode import user_frame
from hangtrace.tracer.analyze.stuck.stacktree import (
    frame_label,
    pick_thread,
    process_frames,
    python_frames,
    threads_of,
)
from hangtrace.tracer.diagnosis import Diagnosis, Kind
from hangtrace.tracer.process_model import joined, parent_pid, process_argv, requested
from hangtrace.tracer.snapshot import ProcessInfo

#: multiprocessing's Popen classes: ``Process.join`` waits here (popen_fork.py et al.)
_MP_POPEN = frozenset({"popen_fork.py", "popen_spawn_posix.py", "popen_forkserver.py"})
_WAIT_CALLS = frozenset({"wait4", "waitid"})
_MAX_NAMED = 3
_ARGV_CHARS = 120


def _base(f: Dict[str, Any]) -> str:
    return str(f.get("filename") or "").replace("\\", "/").rsplit("/", 1)[-1]


def waits_for_child(thread: Optional[Dict[str, Any]]) -> Optional[str]:
    """How ``thread`` (a stack thread dict) waits for a child: the subprocess or
    multiprocessing frame's label, ``'wait4'`` from the kernel's word, or None."""
    frames = python_frames(thread)
    sub = subprocess_wait(frames)
    if sub:
        return sub
    for f in frames[:6]:
        if _base(f) in _MP_POPEN and str(f.get("name") or "").rsplit(".", 1)[-1] in ("wait", "poll"):
            return frame_label(f)
    k = (thread or {}).get("kernel") or {}
    return str(k["syscall"]) if isinstance(k, dict) and k.get("syscall") in _WAIT_CALLS else None


def _waited_pid(thread: Optional[Dict[str, Any]]) -> Optional[int]:
    k = (thread or {}).get("kernel") or {}
    if not isinstance(k, dict) or k.get("syscall") not in _WAIT_CALLS:
        return None
    for a in k.get("args") or ():
        if isinstance(a, str) and a.startswith("pid "):
            try:
                return int(a[4:])
            except ValueError:
                return None
    return None


def _idle_loader_worker(p: ProcessInfo) -> bool:
    th = pick_thread(p.stacks)
    return any(
        str(f.get("name") or "").rsplit(".", 1)[-1] == "_worker_loop"
        for f in ((th or {}).get("frames") or ())[:6]
    )


def children_waited_for(
    parent: ProcessInfo, procs: Sequence[ProcessInfo], thread: Optional[Dict[str, Any]]
) -> List[ProcessInfo]:
    """The live traced children of ``parent`` it most likely waits for (module doc), newest first."""
    kids = [
        p
        for p in procs
        if p.host == parent.host
        and p.pid != parent.pid
        and parent_pid(p) == parent.pid
        and p.state in ("alive", "unknown")
    ]
    kids.sort(key=lambda p: -(p.start_wall_ns or 0))
    pid = _waited_pid(thread)
    if pid is not None:
        return [p for p in kids if p.pid == pid]
    argv = process_argv(parent)
    own = [p for p in kids if process_argv(p) and process_argv(p) != argv]
    return own or [p for p in kids if not _idle_loader_worker(p)]


def untraced_children(
    parent: ProcessInfo, procs: Sequence[ProcessInfo], thread: Optional[Dict[str, Any]]
) -> List[Dict[str, Any]]:
    """The children of ``parent`` seen when its stacks were taken (``ProcessInfo.children``)
    that are not traced processes of the snapshot, narrowed as in :func:`children_waited_for`."""
    traced = {p.pid for p in procs if p.host == parent.host}
    kids = [
        c
        for c in parent.children
        if isinstance(c, dict) and isinstance(c.get("pid"), int) and c["pid"] not in traced
    ]
    pid = _waited_pid(thread)
    if pid is not None:
        return [c for c in kids if c["pid"] == pid]
    argv = process_argv(parent)
    return [c for c in kids if c.get("argv") and list(c["argv"]) != argv]


def _argv(argv: Sequence[Any]) -> str:
    s = " ".join(str(a) for a in argv)
    return " (%s)" % (s if len(s) <= _ARGV_CHARS else s[:_ARGV_CHARS] + "...") if s else ""


def untraced_text(c: Dict[str, Any]) -> str:
    """``"pid 812 (tar -czf out.tgz ckpt), not traced, state S: blocked in the system call
    read(fd 0 (pipe:[77])), kernel wait pipe_read"``."""
    k = kernel_text(c.get("kernel"))
    return "pid %s%s, not traced%s%s" % (
        c.get("pid"),
        _argv(c.get("argv") or ()),
        ", state %s" % c["state"] if c.get("state") else "",
        ": blocked in the system call %s" % k if k else "",
    )


def child_text(p: ProcessInfo) -> str:
    """``"pid 812 (python evaluate.py --ckpt x), in f (evaluate.py:12) < main (evaluate.py:20):
    socket IO in recv ...; kernel: recvfrom(...)"``."""
    return _child_text(p) + (
        "; it joined or asked to join the job's process group as rank %d too, with the RANK, WORLD_SIZE and "
        "MASTER_ADDR/PORT it inherited" % p.rank
        if p.rank is not None and p.rank >= 0 and (joined(p) or requested(p))
        else ""
    )  # (blind helper 66: an eval script started with subprocess.run)


def _child_text(p: ProcessInfo) -> str:
    head = "pid %d%s" % (p.pid, _argv(process_argv(p)))
    th = pick_thread(p.stacks)
    frames = python_frames(th)
    if not frames:
        return head + " (no stack%s)" % (": %s" % p.stack_error if p.stack_error else "")
    why = blocking_reason(frames, thread=th)
    if why and frame_label(frames[0]) in why:
        # (the reason names the innermost frame already: its callers follow it)
        return "%s: %s%s" % (
            head,
            why,
            ", called from %s" % " < ".join(frame_label(f) for f in frames[1:3]) if frames[1:] else "",
        )
    return "%s, in %s%s" % (head, " < ".join(frame_label(f) for f in frames[:3]), ": %s" % why if why else "")


def child_process(ctx: Ctx, d: Diagnosis) -> None:
    """For the first culprit stuck outside collectives that waits for a child process:
    ``details['child_wait']`` (a sentence for the paragraph, also an evidence line)
    naming the child or children and what they do, or saying no traced child is alive,
    its parts ``details['child_wait_how']`` and ``['child_wait_children']`` (the paragraph
    composes them with the user's line), and ``details['child_wait_at']``, the frame of the user's code that waits (``'main
    (job.py:24)'``) when one is on the stack. Never raises on odd data."""
    if d.kind != Kind.STUCK_OUTSIDE_COLLECTIVE or "child_wait" in d.details or "loader_wait" in d.details:
        return
    for r in d.culprit_ranks[:4]:
        v = ctx.views.get(r)
        if v is None:
            continue
        parts = child_wait_parts(v.proc, ctx.snap.processes)
        if parts is None:
            continue
        how, lead, rest = parts[0], parts[1], name_peers(ctx, parts[2], v.proc.host)
        text = "rank %d waits for %s child process (%s)%s" % (r, lead, how, rest)
        d.details["child_wait"] = text
        d.details["child_wait_how"], d.details["child_wait_children"] = how, rest
        if PIPE_FULL in rest:
            d.details["child_pipe_full"] = (
                True  # (the advice: the rank must read the pipes, not the child change)
            )
        if "and MASTER_ADDR/PORT it inherited" in rest:
            d.details["child_inherited_rank"] = True  # (the advice: clear those variables for the child)
        at = user_frame(process_frames(v.proc)[0] or [])
        if at is not None:  # the line of the user's code that started the wait
            d.details["child_wait_at"] = frame_label(at)
        ctx.add(text)
        return


#: a rank in ``Popen.wait()`` whose child blocks writing a full pipe (the subprocess docs' deadlock)
PIPE_FULL = (
    "; Popen.wait() never reads the child's pipes: with stdout=PIPE or stderr=PIPE the child "
    "blocks once a pipe is full (64 KiB) - use communicate()"
)


def child_wait_text(parent: ProcessInfo, procs: Sequence[ProcessInfo], who: str) -> Optional[str]:
    """``"<who> waits for its child process (run (subprocess.py:550)): pid 812 (...), ..."``
    when ``parent``'s main stack waits for a child (``who``: ``'rank 0'``, ``'pid 816'``),
    naming the children it most likely waits for and what they do; None when it does not
    wait for a child. The sentence of :func:`child_wait_parts`."""
    parts = child_wait_parts(parent, procs)
    return (
        None
        if parts is None
        else "%s waits for %s child process (%s)%s" % (who, parts[1], parts[0], parts[2])
    )


def child_wait_parts(parent: ProcessInfo, procs: Sequence[ProcessInfo]) -> Optional[Tuple[str, str, str]]:
    """``(how, 'its' or 'a', rest)``: how ``parent``'s main stack waits for a child (``'run
    (subprocess.py:550)'``), and after it ``": pid 812 (...), ..."`` naming the children and
    what they do, or ``"; no live traced child of it: ..."``; None when it does not wait for a
    child."""
    th = pick_thread(threads_of(parent))  # (live, or its dump when it died: the timeout rule's culprits)
    how = waits_for_child(th)
    if how is None:
        return None
    named = [child_text(p) for p in children_waited_for(parent, procs, th)]
    named = named or [untraced_text(c) for c in untraced_children(parent, procs, th)]
    if not named:
        return (
            how,
            "a",
            (
                "; no live traced child of it: the child is not a traced Python process (`ps --ppid %d "
                "-o pid,stat,wchan:20,args` on %s lists it)" % (parent.pid, parent.host)
            ),
        )
    rest = ": " + "; ".join(named[:_MAX_NAMED])
    if len(named) > _MAX_NAMED:
        rest += "; and %d more" % (len(named) - _MAX_NAMED)
    if how.startswith("Popen.wait") and any("pipe_write" in n for n in named):
        # (the subprocess docs: wait() with stdout=PIPE/stderr=PIPE deadlocks once the child fills the pipe)
        rest += PIPE_FULL
    return how, "its", rest


def name_peers(ctx: Ctx, text: str, host: str) -> str:
    """``'peer pid 812 (python3 job.py)'`` (a socket's other end, collect/kernelwait.py)
    becomes ``'peer pid 812: rank 0'`` when pid 812 on ``host`` is a rank of the snapshot:
    an evaluator that waits on a server thread of the rank that waits for it."""
    return peerwait.name_peers(
        text, {v.proc.pid: "rank %d" % r for r, v in ctx.views.items() if v.proc.host == host}
    )  # (the model's ranks: not a child with RANK)
