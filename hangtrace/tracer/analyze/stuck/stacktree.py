"""Merge the Python stacks of every rank into one prefix tree, as LLNL STAT does.

Input: ``ProcessInfo`` objects (``tracer.model``) whose ``stacks`` hold threads in
py-spy's JSON shape::

    [{'thread_name': 'MainThread', 'thread_id': int, 'active': bool,
      'frames': [{'name': str, 'filename': str, 'line': int}, ...]}, ...]

with frames **innermost first**. When ``stacks`` is empty, the faulthandler text of
``signals['dump' | 'sigterm' | 'fatal']['text']`` is parsed instead (see
``stackmodel/faulthandler_text.parse_faulthandler_text``).

Per process one thread is used: the main thread (``thread_name == 'MainThread'``; of a Ray
actor, unless it holds no frame of the user's while another thread does - its main thread
idles in Ray's task loop while Ray Train V2's ``TrainingThread`` runs ``train_func`` -, then
that thread - the one its records show at work first, ``working_threads`` -), else the first
active thread, else the first thread, never one of hangtrace's own threads
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
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from hangtrace.tracer.stackmodel.usercode import user_frame
from hangtrace.tracer.snapshot import ProcessInfo

#: one py-spy frame: {'name', 'filename', 'line', 'native'?}
Frame = Dict[str, Any]
#: one thread: {'thread_name', 'thread_id', 'active', 'frames': [Frame] innermost first}
Thread = Dict[str, Any]

__all__ = [
    "StackNode",
    "StackTree",
    "pick_thread",
    "process_frames",
    "frame_label",
    "merge_stacks",
    "classes",
    "outliers",
    "missing_from_common_frame",
    "format_ranks",
]

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


def pick_thread(
    threads: Optional[List[Any]], prefer_user: bool = False, workers: Sequence[str] = ()
) -> Optional[Thread]:
    """The thread to analyse from a thread list (see module doc), or None. ``prefer_user``
    (a Ray actor's threads: its main thread is Ray's task loop): a thread running the
    user's code wins over a main thread that runs none; of several, the first named in
    ``workers`` (the threads the process's records show at work, newest first)."""
    cands = [t for t in threads or () if isinstance(t, dict) and not _own_thread(t)]
    if not cands:
        return None
    main = next((t for t in cands if t.get("thread_name") == "MainThread"), None)
    if prefer_user and main is not None and user_frame(python_frames(main)) is None:
        # a main thread without a frame of the user's idles in a framework's loop (a Ray
        # actor's ``Worker.main_loop``) while another thread runs the user's code (Ray
        # Train V2's ``TrainingThread``): that thread is the rank's (blind job rt_stuck_queue)
        working = [t for t in cands if t is not main and user_frame(python_frames(t)) is not None]
        for name in workers:
            for t in working:
                if t.get("thread_name") == name:
                    return t
        if working:
            return next((t for t in working if t.get("active")), working[0])
    if main is not None:
        return main
    for t in cands:
        if t.get("active") and t.get("frames"):
            return t
    for t in cands:
        if t.get("frames"):
            return t
    return cands[0]


def working_threads(proc: ProcessInfo) -> List[str]:
    """Names of the threads ``proc``'s records show at work, newest first: the thread of its
    newest collective or p2p, then those of its Ray waits (Ray Train's ``ray.train.report``
    waits in the training thread), then of its newest record."""
    sm = proc.summary
    if sm is None:
        return []
    recs = [sm.last_comm] + sorted(sm.waits.values(), key=lambda r: -(r.get("t_wall_ns") or 0)) + [sm.last]
    out: List[str] = []
    for r in recs:
        name = str((r or {}).get("thread") or "")
        if name and name != "MainThread" and name not in out:
            out.append(name)
    return out


def threads_of(proc: ProcessInfo) -> Optional[List[Any]]:
    """``proc``'s threads: its live stacks, else those of its faulthandler dumps (on
    request, fatal signal, SIGTERM: a dead process's last stacks), else None."""
    if proc.stacks:
        return proc.stacks
    sig = proc.signals or {}
    for name in ("dump", "fatal", "sigterm"):
        text = (sig.get(name) or {}).get("text")
        if text:
            try:
                from hangtrace.tracer.stackmodel.faulthandler_text import parse_faulthandler_text

                parse: Callable[[str], List[Any]] = parse_faulthandler_text
                threads = parse(text)
            except Exception:  # parser unavailable or confused: no stack, not a crash
                threads = []
            if threads:
                return threads
    return None


def python_frames(thread: Optional[Thread]) -> List[Frame]:
    """The Python frames (innermost first) of a thread dict, native frames left out; [] for
    None or a thread without frames."""
    return [f for f in (thread or {}).get("frames") or () if isinstance(f, dict) and not f.get("native")]


def process_frames(proc: ProcessInfo) -> Tuple[Optional[List[Frame]], Optional[Thread]]:
    """Python frames (innermost first) of the analysed thread of ``proc``, or None.

    Returns ``(frames, thread)``; ``frames`` excludes native frames.
    """
    t = pick_thread(
        threads_of(proc),
        prefer_user=bool((proc.meta or {}).get("ray_actor_id")),
        workers=working_threads(proc),
    )
    if t is None:
        return None, None
    return python_frames(t), t


class StackNode:
    """One frame in the merged tree. ``ranks``: every rank whose path passes here;
    ``ends``: ranks whose path ends here (innermost frame); ``children``: key -> node."""

    __slots__ = ("label", "key", "children", "ranks", "ends", "parent", "depth", "line")

    def __init__(
        self, label: Optional[str], key: Optional[Tuple[Any, ...]], parent: Optional["StackNode"] = None
    ) -> None:
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
    frame dict (for ``blocking.blocking_reason``)."""

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
        out.append(
            {
                "frames": [NO_STACK],
                "ranks": list(tree.no_stack),
                "count": len(tree.no_stack),
                "outlier": False,
            }
        )
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
    return {
        "frames": node.path(),
        "ranks_in": len(inside),
        "missing": [r for r in tree.ranks if r not in inside],
    }


# --- what is a frame doing? ------------------------------------------------------------
