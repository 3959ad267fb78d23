"""Why a stack looks blocked outside collectives, in words (pure).

From a thread's frames (innermost first), py-spy's ``active``/``owns_gil`` and the
kernel's word on its system call (``'kernel'``, collect/kernelwait.py) and the source line
of its innermost frame (``'code'``, collect/sourcelines.py): a known blocking call (queue,
lock, socket, future, ``ray.get``, sleep), a wait in ``subprocess``, a C-level lock
acquire, or "blocked in the system call ...". Also: the innermost torch.distributed frame
(:func:`collective_frame`), and a kernel wait channel glossed in words
(:data:`WCHAN_MEANS`). Split from ``stacktree.py`` (which merges and classifies stacks).
"""

from __future__ import annotations

import os
import re
from typing import Any, Dict, Iterable, List, Optional

from hangtrace.tracer.ring import layout as F
from hangtrace.tracer.analyze.stuck.stacktree import Frame, Thread, _short, frame_label
from hangtrace.tracer.snapshot import ProcessInfo

_BLOCKING = (
    # (file base name or '' for any, short function names, reason)
    ("queue.py", ("get", "put", "join"), "queue.get/put (waiting for a producer/consumer)"),
    ("queues.py", ("get", "put", "_poll", "poll"), "multiprocessing queue"),
    (
        "threading.py",
        ("wait", "acquire", "join", "_wait_for_tstate_lock"),
        "thread lock/condition/event wait",
    ),
    (
        "connection.py",
        ("recv", "recv_bytes", "_recv", "_recv_bytes", "poll", "_poll", "wait"),
        "pipe/socket recv",
    ),
    ("selectors.py", ("select",), "select() on sockets/files"),
    ("socket.py", ("accept", "recv", "recv_into", "readinto", "connect"), "socket IO"),
    ("ssl.py", ("read", "recv", "recv_into", "do_handshake"), "TLS socket IO"),
    ("_base.py", ("result", "wait"), "waiting for a future"),
    ("worker.py", ("get", "wait", "get_objects"), "ray.get/ray.wait"),
    ("base_events.py", ("_run_once", "run_forever", "run_until_complete"), "asyncio event loop idle"),
    ("synchronize.py", ("acquire", "wait", "__enter__"), "multiprocessing lock"),
    ("filelock.py", ("acquire",), "file lock"),
    ("_api.py", ("acquire",), "file lock"),
    ("_acquire.py", ("_poll_until_acquired", "_acquire_level"), "file lock (the filelock package: polling)"),
    ("_lock.py", ("acquire", "__enter__"), "file lock"),
    ("", ("sleep",), "sleep"),
    ("", ("input", "readline", "read", "readinto"), "blocking read"),
    ("", ("acquire", "wait", "lock"), "lock/wait"),
)

#: the modules of ``_BLOCKING``: their waits are read by name, never as a C-level lock
_BLOCKING_FILES = frozenset(fbase for fbase, _n, _r in _BLOCKING if fbase)

#: the collectives and p2p ops of the ring format (``ring/layout.OPS``, less the group
#: management calls) and ``Work.wait``: a frame of one of them is a wait inside a collective
_COLLECTIVE_NAMES = (
    frozenset(F.OPS) - {"", "init_process_group", "new_group", "new_subgroups", "destroy_process_group"}
) | {"wait"}


def collective_frame(frames: Optional[Iterable[Frame]]) -> Optional[str]:
    """The innermost frame of ``frames`` (innermost first) that is a torch.distributed
    collective/p2p call (file under ``torch/distributed``), as a label, or None."""
    for f in frames or ():
        fn = (f.get("filename") or "").replace("\\", "/")
        if "torch/distributed" in fn and _short(f.get("name")) in _COLLECTIVE_NAMES:
            return frame_label(f)
    return None


#: subprocess.py's waits: the innermost call inside them (a select on the child's pipes,
#: a waitpid) is the child's doing, so they win over it; the API the user called is named
_SUBPROCESS = frozenset(
    {
        "wait",
        "communicate",
        "_communicate",
        "_wait",
        "_try_wait",
        "run",
        "call",
        "check_call",
        "check_output",
        "getstatusoutput",
        "getoutput",
    }
)
_SUBPROCESS_DEPTH = 8  # innermost frames searched for it


def subprocess_wait(frames: Optional[List[Frame]]) -> Optional[str]:
    """The label of the outermost ``subprocess.py`` wait the innermost frames are in
    (``'run (subprocess.py:550)'``), or None."""
    fs = list(frames or ())[:_SUBPROCESS_DEPTH]
    at = next(
        (
            i
            for i, f in enumerate(fs)
            if os.path.basename(f.get("filename") or "") == "subprocess.py"
            and _short(f.get("name")) in _SUBPROCESS
        ),
        None,
    )
    if at is None:
        return None
    while at + 1 < len(fs) and os.path.basename(fs[at + 1].get("filename") or "") == "subprocess.py":
        at += 1
    return frame_label(fs[at])


#: What a kernel wait channel (``/proc/PID/wchan``: the kernel function a thread sleeps in)
#: means, for the waits a hung thread is seen in. Names from the Linux sources (fs/pipe.c,
#: fs/fifo via fs/pipe.c ``wait_for_partner``, kernel/exit.c ``do_wait``, fs/locks.c,
#: net/unix/af_unix.c, net/sunrpc); they vary a little between kernel versions, hence the
#: variants. A wait not listed is shown by its name alone.
WCHAN_MEANS: Dict[str, str] = {
    "wait_for_partner": "a FIFO open waits until another process opens its other end",
    "pipe_read": "reading a pipe or FIFO no process writes to",
    "pipe_wait_readable": "reading a pipe or FIFO no process writes to",
    "pipe_write": "writing a full pipe or FIFO no process reads",
    "anon_pipe_write": "writing a full pipe no process reads",
    "anon_pipe_read": "reading a pipe no process writes to",
    "pipe_wait_writable": "writing a full pipe or FIFO no process reads",
    "do_wait": "waiting for a child process to exit",
    "locks_lock_inode_wait": "a file lock another process holds",
    "flock_lock_inode_wait": "a file lock another process holds",
    "posix_lock_inode_wait": "a file lock another process holds",
    "unix_stream_read_generic": "reading a Unix socket whose peer sends nothing",
    "unix_stream_data_wait": "reading a Unix socket whose peer sends nothing",
    "inet_csk_accept": "accepting on a socket no client connects to",
    "wait_woken": "a socket or terminal read that waits for data; for a TCP recv, the peer sends nothing",
    "sk_wait_data": "a socket read that waits for data the peer does not send",
    "rpc_wait_bit_killable": "an NFS/RPC server's reply",
}


def kernel_text(kernel: Optional[Dict[str, Any]]) -> Optional[str]:
    """``"openat('/ckpt/shard1.pt'), kernel wait wait_for_partner (a FIFO open waits until
    another process opens its other end)"`` from a thread's ``'kernel'`` facts
    (collect/kernelwait.py; the gloss from :data:`WCHAN_MEANS`), or None when absent."""
    if not isinstance(kernel, dict) or not kernel.get("syscall"):
        return None
    args = [str(a) for a in kernel.get("args") or ()]
    s = "%s(%s)" % (kernel["syscall"], ", ".join(args)) if args else str(kernel["syscall"])
    w = kernel.get("wchan")
    if not w:
        return s
    means = WCHAN_MEANS.get(
        str(w).split(".", 1)[0]
    )  # ('poll_schedule_timeout.constprop.0': a compiler clone)
    return s + ", kernel wait %s%s" % (w, " (%s)" % means if means else "")


def blocking_reason(
    frames: Optional[List[Frame]], active: Optional[bool] = None, thread: Optional[Thread] = None
) -> Optional[str]:
    """Why a stack (innermost first) looks blocked outside collectives, or None.

    Checks the innermost three frames against known blocking calls (queue.get, locks,
    events, sockets, futures, ray.get, sleep, reads), and the innermost eight for a wait
    in ``subprocess`` (which wins: its select or waitpid waits on the child); py-spy's
    ``active == False`` (the thread was idle in a system call) counts as blocked too.
    ``thread`` (the stack's thread dict) adds what the kernel said it waits in (its
    ``'kernel'``, collect/kernelwait.py) and whether it holds the GIL; its ``active``
    is used when ``active`` is None. Returns a short reason string, e.g.
    ``'queue.get/put (waiting for a producer/consumer) in get (queue.py:171)'``,
    ``'blocked in the system call openat('/x.pt'), kernel wait wait_for_partner, in
    __init__ (serialization.py:828)'``.
    """
    th = thread or {}
    active = th.get("active") if active is None else active
    kt = kernel_text(th.get("kernel"))
    gil = (
        "; it holds the GIL, so no other Python thread of the process runs"
        if (th.get("owns_gil") and active is False)
        else ""
    )
    sub = subprocess_wait(frames)
    if sub:
        return "waiting for a subprocess in %s%s%s" % (sub, "; kernel: %s" % kt if kt else "", gil)
    hits = _blocking_hits(frames)
    if hits:
        f, _fb, reason = hits[0]
        if (
            _fb == "threading.py"
        ):  # a queue's or a future's wait is threading's Condition.wait: its caller says what for
            f, _fb, reason = next((h for h in hits if h[1] and h[1] != "threading.py"), hits[0])
        if (th.get("kernel") or {}).get("syscall") in _SAYS_NOTHING:
            kt = None  # (every Python-level lock, queue or event wait is a futex, a polling wait a sleep)
        return "%s in %s%s%s" % (reason, frame_label(f), "; kernel: %s" % kt if kt else "", gil)
    if active is False and frames:
        lock = c_lock_wait(frames, th) or poll_wait(frames, th)
        if lock:
            return lock + gil
        code = code_text(frames[0])
        if kt:
            return "blocked in the system call %s, in %s%s%s" % (kt, frame_label(frames[0]), code, gil)
        return "idle in a system call (py-spy: thread not active) in %s%s%s" % (
            frame_label(frames[0]),
            code,
            gil,
        )
    return None


#: system calls that add nothing to a named Python-level wait
_SAYS_NOTHING = frozenset({"futex", "nanosleep", "clock_nanosleep"})
_SLEEP_CALLS = frozenset({"nanosleep", "clock_nanosleep"})


def sleeping(frames: Optional[List[Frame]], thread: Optional[Thread]) -> bool:
    """Is the thread asleep in ``time.sleep`` (a C call: its innermost Python frame is the
    line that calls it)? The kernel says (clock_)nanosleep, or that line calls ``sleep(``."""
    k = (thread or {}).get("kernel") or {}
    f = next((x for x in frames or () if not x.get("native")), None)
    if f is None:
        return False
    return (isinstance(k, dict) and k.get("syscall") in _SLEEP_CALLS) or "sleep(" in str(f.get("code") or "")


def poll_loop(frames: Optional[List[Frame]]) -> Optional[Any]:
    """``(frame, line, 'while not os.path.exists(marker):')``: the innermost ``while`` loop
    around the innermost frame's line or its caller's (``'loop'`` of a frame,
    collect/sourcelines.py ``enclosing_blocks``), or None."""
    for f in [x for x in frames or () if not x.get("native")][:2]:
        loop = f.get("loop")
        if isinstance(loop, (list, tuple)) and len(loop) > 1:
            try:
                return f, int(loop[0]), str(loop[1])
            except (TypeError, ValueError):
                return None
    return None


def poll_wait(frames: Optional[List[Frame]], thread: Optional[Thread]) -> Optional[str]:
    """``"polling in a loop: `while not os.path.exists(marker):` (job.py:55) sleeps at
    `time.sleep(0.05)` in wait_for_marker (job.py:56)"`` for a thread asleep in
    ``time.sleep`` inside a ``while`` loop (blind helper 62: the loop's condition is what it
    waits for, the kernel's clock_nanosleep says nothing); ``"asleep in wait (job.py:9):
    `time.sleep(600)`"`` without a loop; None when the thread is not asleep."""
    if not sleeping(frames, thread):
        return None
    f = next(x for x in frames or () if not x.get("native"))
    found = poll_loop(frames)
    if found is None:
        return "asleep in %s%s" % (frame_label(f), code_text(f))
    lf, line, code = found
    sleep = " at `%s`" % f["code"] if f.get("code") else ""
    return "polling in a loop: `%s` (%s:%d) sleeps%s in %s" % (
        code,
        os.path.basename(str(lf.get("filename") or "?")),
        line,
        sleep,
        frame_label(f),
    )


def _blocking_hits(frames: Optional[List[Frame]]) -> List[Any]:
    """``(frame, file base, reason)`` of each of the innermost three frames that is a known
    blocking call (:data:`_BLOCKING`, first entry that matches), innermost first."""
    out = []
    for f in list(frames or ())[:3]:
        base = os.path.basename(f.get("filename") or "")
        name = _short(f.get("name"))
        for fbase, names, reason in _BLOCKING:
            if (not fbase or fbase == base) and name in names:
                out.append((f, fbase, reason))
                break
    return out


def code_text(f: Frame) -> str:
    """``': `with upload_lock:`'`` from a frame's source line (collect/kernelwait.py), or ''."""
    c = f.get("code")
    return ": `%s`" % c if c else ""


#: a source line that enters a lock in C: ``with x_lock:`` (Lock/RLock ``__enter__`` are C)
#: or a ``.acquire(`` call
_LOCK_LINE = re.compile(r"^\s*(async\s+)?with\s|\.acquire\(")


def c_lock_frame(frames: Optional[List[Frame]], thread: Optional[Thread]) -> Optional[Frame]:
    """The innermost Python frame when the thread sleeps in a futex and that frame's source
    line enters a lock (``with``, ``.acquire(``): ``threading.Lock``/``RLock`` are acquired
    in C, so no ``acquire`` frame shows; else None. Needs the line (collect/kernelwait.py
    ``sourcelines.add_source_lines``) and the kernel's word."""
    k = (thread or {}).get("kernel") or {}
    if not isinstance(k, dict) or k.get("syscall") != "futex":
        return None
    f = next((x for x in frames or () if not x.get("native")), None)
    if f is None or not _LOCK_LINE.search(str(f.get("code") or "")):
        return None
    if os.path.basename(str(f.get("filename") or "")) in _BLOCKING_FILES:
        return None  # (the standard library's own waits: Condition.wait's `waiter.acquire()` is idle, not a lock)
    return f


def c_lock_wait(frames: Optional[List[Frame]], thread: Optional[Thread]) -> Optional[str]:
    """``"waiting for a lock (a C-level acquire; kernel: futex) at main (job.py:33): `with
    upload_lock:`"`` for :func:`c_lock_frame`'s frame, else None."""
    f = c_lock_frame(frames, thread)
    return (
        None
        if f is None
        else "waiting for a lock at %s%s%s" % (frame_label(f), code_text(f), held_text(frames))
    )


def held_text(frames: Optional[List[Frame]]) -> str:
    """``" (inside `with metrics_lock:` at job.py:77)"``: the ``with`` blocks the thread's
    frames are inside (``'with'`` of a frame: collect/sourcelines.py ``enclosing_blocks``,
    innermost first), i.e. what a thread waiting for a lock already holds; '' when none."""
    seen: List[str] = []
    for f in frames or ():
        for item in f.get("with") or ():
            try:
                line, code = int(item[0]), str(item[1])
            except (TypeError, ValueError, IndexError):
                continue
            text = "`%s` at %s:%d" % (code, os.path.basename(str(f.get("filename") or "?")), line)
            if text not in seen:
                seen.append(text)
    return " (inside %s)" % ", ".join(seen[:3]) if seen else ""


#: torch.distributed functions of the rendezvous (torch/distributed/distributed_c10d.py and
#: rendezvous.py: the store's creation, the env/tcp/file handlers, the store-based barrier
#: that waits for WORLD_SIZE members)
RENDEZVOUS_FUNCS = frozenset(
    {
        "init_process_group",
        "rendezvous",
        "_create_c10d_store",
        "_env_rendezvous_handler",
        "_tcp_rendezvous_handler",
        "_file_rendezvous_handler",
        "_store_based_barrier",
    }
)


def in_rendezvous_stack(p: ProcessInfo) -> bool:
    """Has a thread of ``p``'s live stacks a :data:`RENDEZVOUS_FUNCS` frame of torch.distributed?"""
    return any(
        f.get("name") in RENDEZVOUS_FUNCS and "distributed" in str(f.get("filename") or "")
        for th in p.stacks or ()
        for f in th.get("frames") or ()
    )
