"""Merge the Python stacks of every rank into one prefix tree, as LLNL STAT does.

Input: ``ProcessInfo`` objects (``tracer.model``) whose ``stacks`` hold threads in
py-spy's JSON shape::

    [{'thread_name': 'MainThread', 'thread_id': int, 'active': bool,
      'frames': [{'name': str, 'filename': str, 'line': int}, ...]}, ...]

with frames **innermost first**. When ``stacks`` is empty, the faulthandler text of
``signals['dump' | 'sigterm' | 'fatal']['text']`` is parsed instead (see
``tracer.stacks.parse_faulthandler_text``).

Per process one thread is used: the main thread (``thread_name == 'MainThread'``, else
the first active thread, else the first thread), never one of hangtrace's own threads
(names starting with ``'hangtrace'``). Native frames (``'native': True``) are dropped.

The tree is keyed outer -> inner. Two frames are the same node when their *function*
(short name, py-spy's ``Queue.get`` == faulthandler's ``get``) and file base name agree
(``key='function'``, STAT's default) or when function, file and line agree
(``key='line'``). An *equivalence class* is the set of ranks whose whole path is equal:
``{'frames': [label, ...] outer->inner, 'ranks': [int, ...] sorted, 'count': int}``.
Labels are ``'func (file.py:line)'``, or ``'func (file.py)'`` when ranks merged into the
node stand at different lines of that function.

Everything here is pure (no I/O) and linear in ranks x stack depth.
"""
import os
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

from hangtrace.tracer.snapshot import ProcessInfo

#: one py-spy frame: {'name', 'filename', 'line', 'native'?}
Frame = Dict[str, Any]
#: one thread: {'thread_name', 'thread_id', 'active', 'frames': [Frame] innermost first}
Thread = Dict[str, Any]

__all__ = ["StackNode", "StackTree", "pick_thread", "process_frames", "frame_label",
           "merge_stacks", "classes", "outliers", "missing_from_common_frame",
           "format_ranks", "blocking_reason", "collective_frame", "kernel_text", "subprocess_wait"]

NO_STACK = "<no stack>"


def format_ranks(ranks: Iterable[Any], limit: Optional[int] = None) -> str:
    """Compact text of a rank list: ``[0, 1, 2, 5, 7, 8]`` -> ``'0-2,5,7-8'``.

    ``limit``: at most this many ranges, then ``',... (N ranks)'``.
    """
    rs = sorted(set(int(r) for r in ranks))
    if not rs:
        return "none"
    parts = []
    start = prev = rs[0]
    for r in rs[1:]:
        if r == prev + 1:
            prev = r
            continue
        parts.append(str(start) if start == prev else "%d-%d" % (start, prev))
        start = prev = r
    parts.append(str(start) if start == prev else "%d-%d" % (start, prev))
    if limit is not None and len(parts) > limit:
        return ",".join(parts[:limit]) + ",... (%d ranks)" % len(rs)
    return ",".join(parts)


def frame_label(frame: Frame) -> str:
    """``'func (file.py:line)'`` (base name of the file; no line when unknown)."""
    fn = os.path.basename(frame.get("filename") or "?") or "?"
    line = frame.get("line") or 0
    name = frame.get("name") or "?"
    return "%s (%s:%d)" % (name, fn, line) if line else "%s (%s)" % (name, fn)


def _short(name: Optional[str]) -> str:
    return (name or "?").rsplit(".", 1)[-1]


def _frame_key(frame: Frame, key: str) -> Tuple[Any, ...]:
    base = os.path.basename(frame.get("filename") or "?")
    if key == "line":
        return (_short(frame.get("name")), base, frame.get("line") or 0)
    return (_short(frame.get("name")), base)


def _own_thread(t: Thread) -> bool:
    return str(t.get("thread_name") or "").startswith("hangtrace")


def pick_thread(threads: Optional[List[Any]]) -> Optional[Thread]:
    """The thread to analyse from a thread list (see module doc), or None."""
    cands = [t for t in threads or () if isinstance(t, dict) and not _own_thread(t)]
    if not cands:
        return None
    for t in cands:
        if t.get("thread_name") == "MainThread":
            return t
    for t in cands:
        if t.get("active") and t.get("frames"):
            return t
    for t in cands:
        if t.get("frames"):
            return t
    return cands[0]


def _threads_of(proc: ProcessInfo) -> Optional[List[Any]]:
    if proc.stacks:
        return proc.stacks
    sig = proc.signals or {}
    for name in ("dump", "fatal", "sigterm"):
        text = (sig.get(name) or {}).get("text")
        if text:
            try:
                from hangtrace.tracer.collect.stacks import parse_faulthandler_text
                parse: Callable[[str], List[Any]] = parse_faulthandler_text  # untyped (collect/)
                threads = parse(text)
            except Exception:  # parser unavailable or confused: no stack, not a crash
                threads = []
            if threads:
                return threads
    return None


def process_frames(proc: ProcessInfo) -> Tuple[Optional[List[Frame]], Optional[Thread]]:
    """Python frames (innermost first) of the analysed thread of ``proc``, or None.

    Returns ``(frames, thread)``; ``frames`` excludes native frames.
    """
    t = pick_thread(_threads_of(proc))
    if t is None:
        return None, None
    frames = [f for f in t.get("frames") or () if isinstance(f, dict) and not f.get("native")]
    return frames, t


class StackNode:
    """One frame in the merged tree. ``ranks``: every rank whose path passes here;
    ``ends``: ranks whose path ends here (innermost frame); ``children``: key -> node."""

    __slots__ = ("label", "key", "children", "ranks", "ends", "parent", "depth", "line")

    def __init__(self, label: Optional[str], key: Optional[Tuple[Any, ...]],
                 parent: Optional["StackNode"] = None) -> None:
        self.label, self.key, self.parent = label, key, parent
        self.children: Dict[Tuple[Any, ...], StackNode] = {}
        self.ranks: List[int] = []
        self.ends: List[int] = []
        self.depth: int = 0 if parent is None else parent.depth + 1
        self.line: Optional[int] = 0

    def path(self) -> List[str]:
        """Labels from the outermost frame to this node (root excluded)."""
        out: List[str] = []
        n: Optional[StackNode] = self
        while n is not None and n.parent is not None:
            out.append(n.label or "?")
            n = n.parent
        out.reverse()
        return out


class StackTree:
    """Result of :func:`merge_stacks`. ``root`` (label None); ``no_stack``: ranks without a
    usable stack; ``ranks``: every rank with a stack; ``innermost``: rank -> innermost
    frame dict (for :func:`blocking_reason`)."""

    def __init__(self) -> None:
        self.root = StackNode(None, None)
        self.no_stack: List[int] = []
        self.ranks: List[int] = []
        self.innermost: Dict[int, Frame] = {}
        self.active: Dict[int, Optional[bool]] = {}

    def nodes(self) -> Iterator[StackNode]:
        """Every node, depth first (root included)."""
        stack = [self.root]
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())


def merge_stacks(procs: Iterable[ProcessInfo], key: str = "function") -> StackTree:
    """Merge the analysed thread of every process into a :class:`StackTree`.

    ``procs``: iterable of ``ProcessInfo`` (processes with ``rank < 0`` are skipped; with
    several processes of one rank, the first is used). ``key``: ``'function'`` or
    ``'line'`` (see module doc).
    """
    tree = StackTree()
    seen: set[int] = set()
    for p in procs:
        r = p.rank
        if r is None or r < 0 or r in seen:
            continue
        seen.add(r)
        frames, thread = process_frames(p)
        if not frames:
            tree.no_stack.append(r)
            continue
        tree.ranks.append(r)
        tree.innermost[r] = frames[0]
        tree.active[r] = thread.get("active") if thread else None
        node = tree.root
        node.ranks.append(r)
        for f in reversed(frames):
            k = _frame_key(f, key)
            child = node.children.get(k)
            if child is None:
                child = node.children[k] = StackNode(frame_label(f), k, node)
                child.line = f.get("line") or 0
            elif child.line is not None and child.line != (f.get("line") or 0):
                # merged frames at different lines of one function: label without a line
                child.line = None
                child.label = frame_label(dict(f, line=0))
            child.ranks.append(r)
            node = child
        node.ends.append(r)
    tree.no_stack.sort()
    tree.ranks.sort()
    return tree


def classes(tree: StackTree, outlier_fraction: float = 0.1) -> List[Dict[str, Any]]:
    """Equivalence classes of ``tree``: ``[{'frames': [label] outer->inner, 'ranks': [int],
    'count': int, 'outlier': bool}]``, largest first; ranks without a stack form a last
    class with ``frames == ['<no stack>']``. ``outlier``: see :func:`outliers`.
    """
    out: List[Dict[str, Any]] = []
    for n in tree.nodes():
        if n.ends:
            out.append({"frames": n.path(), "ranks": sorted(n.ends), "count": len(n.ends)})
    out.sort(key=lambda c: (-c["count"], c["ranks"][0]))
    total = len(tree.ranks)
    for c in out:
        c["outlier"] = _is_outlier(c["count"], total, len(out), outlier_fraction)
    if tree.no_stack:
        out.append({"frames": [NO_STACK], "ranks": list(tree.no_stack),
                    "count": len(tree.no_stack), "outlier": False})
    return out


def _is_outlier(count: int, total: int, nclasses: int, fraction: float) -> bool:
    return nclasses > 1 and count <= max(1, int(total * fraction)) and count * 2 < total


def outliers(class_list: List[Dict[str, Any]], fraction: float = 0.1) -> List[Dict[str, Any]]:
    """Classes with few ranks: at most ``max(1, fraction * ranks with stacks)`` ranks and
    fewer than half of them, when there is more than one class. The ``'<no stack>'`` class
    is never an outlier."""
    real = [c for c in class_list if c["frames"] != [NO_STACK]]
    total = sum(c["count"] for c in real)
    return [c for c in real if _is_outlier(c["count"], total, len(real), fraction)]


def missing_from_common_frame(tree: StackTree, majority: float = 0.5) -> Optional[Dict[str, Any]]:
    """The deepest frame that more than ``majority`` of the ranks share, following the
    heaviest child from the root, and the ranks (with stacks) that are *not* in it.

    Returns ``{'frames': [label] outer->inner, 'ranks_in': int, 'missing': [int]}`` or
    None when every rank is in it (or there are no stacks). This is the "who is not where
    everyone else waits" question: the missing ranks are the usual suspects.
    """
    total = len(tree.ranks)
    if not total:
        return None
    node = tree.root
    while node.children:
        best = max(node.children.values(), key=lambda c: len(c.ranks))
        if len(best.ranks) <= total * majority:
            break
        node = best
    if node is tree.root or len(node.ranks) == total:
        return None
    inside = set(node.ranks)
    return {"frames": node.path(), "ranks_in": len(inside),
            "missing": [r for r in tree.ranks if r not in inside]}


# --- what is a frame doing? ------------------------------------------------------------
_BLOCKING = (
    # (file base name or '' for any, short function names, reason)
    ("queue.py", ("get", "put", "join"), "queue.get/put (waiting for a producer/consumer)"),
    ("queues.py", ("get", "put", "_poll", "poll"), "multiprocessing queue"),
    ("threading.py", ("wait", "acquire", "join", "_wait_for_tstate_lock"), "thread lock/condition/event wait"),
    ("connection.py", ("recv", "recv_bytes", "_recv", "_recv_bytes", "poll", "_poll", "wait"), "pipe/socket recv"),
    ("selectors.py", ("select",), "select() on sockets/files"),
    ("socket.py", ("accept", "recv", "recv_into", "readinto", "connect"), "socket IO"),
    ("ssl.py", ("read", "recv", "recv_into", "do_handshake"), "TLS socket IO"),
    ("_base.py", ("result", "wait"), "waiting for a future"),
    ("worker.py", ("get", "wait", "get_objects"), "ray.get/ray.wait"),
    ("base_events.py", ("_run_once", "run_forever", "run_until_complete"), "asyncio event loop idle"),
    ("synchronize.py", ("acquire", "wait", "__enter__"), "multiprocessing lock"),
    ("filelock.py", ("acquire",), "file lock"),
    ("_api.py", ("acquire",), "file lock"),
    ("", ("sleep",), "sleep"),
    ("", ("input", "readline", "read", "readinto"), "blocking read"),
    ("", ("acquire", "wait", "lock"), "lock/wait"),
)

_COLLECTIVE_NAMES = frozenset((
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "reduce_scatter",
    "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "broadcast", "broadcast_object_list",
    "reduce", "gather", "gather_object", "scatter", "scatter_object_list", "barrier",
    "monitored_barrier", "send", "recv", "isend", "irecv", "batch_isend_irecv", "wait",
    "_allgather_base", "_reduce_scatter_base", "all_gather_single", "reduce_scatter_single",
    "all_gather_coalesced", "all_reduce_coalesced", "send_object_list", "recv_object_list"))


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
_SUBPROCESS = frozenset({"wait", "communicate", "_communicate", "_wait", "_try_wait", "run", "call",
                         "check_call", "check_output", "getstatusoutput", "getoutput"})
_SUBPROCESS_DEPTH = 8  # innermost frames searched for it


def subprocess_wait(frames: Optional[List[Frame]]) -> Optional[str]:
    """The label of the outermost ``subprocess.py`` wait the innermost frames are in
    (``'run (subprocess.py:550)'``), or None."""
    fs = list(frames or ())[:_SUBPROCESS_DEPTH]
    at = next((i for i, f in enumerate(fs) if os.path.basename(f.get("filename") or "") == "subprocess.py"
               and _short(f.get("name")) in _SUBPROCESS), None)
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
    "pipe_wait_writable": "writing a full pipe or FIFO no process reads",
    "do_wait": "waiting for a child process to exit",
    "locks_lock_inode_wait": "a file lock another process holds",
    "flock_lock_inode_wait": "a file lock another process holds",
    "posix_lock_inode_wait": "a file lock another process holds",
    "unix_stream_read_generic": "reading a Unix socket whose peer sends nothing",
    "unix_stream_data_wait": "reading a Unix socket whose peer sends nothing",
    "inet_csk_accept": "accepting on a socket no client connects to",
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
    means = WCHAN_MEANS.get(str(w).split(".", 1)[0])  # ('poll_schedule_timeout.constprop.0': a compiler clone)
    return s + ", kernel wait %s%s" % (w, " (%s)" % means if means else "")


def blocking_reason(frames: Optional[List[Frame]], active: Optional[bool] = None,
                    thread: Optional[Thread] = None) -> Optional[str]:
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
    gil = "; it holds the GIL, so no other Python thread of the process runs" if (
        th.get("owns_gil") and active is False) else ""
    sub = subprocess_wait(frames)
    if sub:
        return "waiting for a subprocess in %s%s%s" % (sub, "; kernel: %s" % kt if kt else "", gil)
    for f in list(frames or ())[:3]:
        base = os.path.basename(f.get("filename") or "")
        name = _short(f.get("name"))
        for fbase, names, reason in _BLOCKING:
            if (not fbase or fbase == base) and name in names:
                return "%s in %s%s%s" % (reason, frame_label(f), "; kernel: %s" % kt if kt else "", gil)
    if active is False and frames:
        if kt:
            return "blocked in the system call %s, in %s%s" % (kt, frame_label(frames[0]), gil)
        return "idle in a system call (py-spy: thread not active) in %s%s" % (frame_label(frames[0]), gil)
    return None
