"""faulthandler's text dumps parsed into the thread format of ``stackmodel/threads.py``.

In: the text ``faulthandler.dump_traceback`` / ``register`` / ``enable`` wrote (one file may
hold several appended dumps; a snapshot keeps it in ``signals[...]['text']``). Out: every
dump in it (:func:`parse_faulthandler_dumps`: header, threads, truncated) or the threads
of the last one (:func:`parse_faulthandler_text`). faulthandler prints "most recent call
first" (innermost first), ``co_name`` only, ``???`` for unknown lines; the main thread is
inferred (``_mark_main``). Pure: no I/O.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Union

from hangtrace.tracer.stackmodel.threads import Thread, is_threading_bootstrap

Dump = Dict[str, Any]  # {'header': str | None, 'threads': [Thread, ...], 'truncated': bool}

# Formats, from CPython's Python/traceback.c (3.8 .. 3.13):
#   "Thread 0x00007f...  (most recent call first):"  / "Current thread 0x... (...):"
#   "Stack (most recent call first):"  (all_threads=False)
#   '  File "x.py", line 3 in f'   '  File "???", line ??? in ???'   "  ..." (depth > 100)
#   "  <no Python frame>"
# Newer versions may add a thread name: 'Thread 0x... [name] (most recent call first):'.
# Threads of one dump are separated by a blank line; consecutive dumps are not.
_THREAD_RE = re.compile(
    r"^(?P<cur>Current thread|Thread) (?P<tid>0x[0-9a-fA-F]+)(?: \[(?P<name>[^\]]*)\])?"
    r" \(most recent call first\):\s*$"
)
_STACK_RE = re.compile(r"^Stack \(most recent call first\):\s*$")
_FRAME_RE = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+|\?+) in (?P<name>.*?)\s*$')
_FATAL_RE = re.compile(r"^Fatal Python error: (?P<msg>.*)$")


def _mark_main(threads: List[Thread]) -> None:
    """faulthandler does not name threads: call the one not started by threading 'MainThread'.

    Inferred: the main thread's outermost frame is the script's ``<module>`` (or runpy),
    while every ``threading.Thread`` starts in ``threading.py: _bootstrap``. CPython lists
    threads newest first, so among several candidates the last one is the oldest.
    """
    if any(t.get("thread_name") for t in threads):
        return
    cands = [t for t in threads if t["frames"] and not is_threading_bootstrap(t["frames"][-1])]
    if not cands:
        return
    mod = [t for t in cands if t["frames"][-1]["name"] == "<module>"]
    (mod or cands)[-1]["thread_name"] = "MainThread"


def parse_faulthandler_dumps(text: Union[str, bytes]) -> List[Dump]:
    """All dumps in a faulthandler file, oldest first.

    ``text``: what ``faulthandler.dump_traceback`` / ``register`` / ``enable`` wrote (one
    file may hold several appended dumps). Returns ``[{'header': str | None, 'threads':
    [thread, ...], 'truncated': bool}]``; ``header`` is e.g. ``"Fatal Python error:
    Segmentation fault"``; ``truncated`` when a thread had more than 100 frames
    (faulthandler prints ``...``). A new dump starts at a header line, at a thread line not
    preceded by a blank line, after unknown unindented text (e.g. "Extension modules: ..."),
    or when a thread id repeats. Unknown indented lines inside a thread are ignored.
    Threads carry ``thread_id`` (int), ``current`` (the "Current thread"), ``thread_name``
    (``'MainThread'`` inferred, see ``_mark_main``, or the ``[name]`` newer Pythons print),
    ``active``/``owns_gil`` None.
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    parser = _DumpParser()
    for raw in text.splitlines():
        parser.feed(raw.rstrip("\r"))
    for d in parser.dumps:
        _mark_main(d["threads"])
    return [d for d in parser.dumps if d["threads"]]


class _DumpParser:
    """The state of :func:`parse_faulthandler_dumps`: lines in (``feed``), ``dumps`` out."""

    def __init__(self) -> None:
        self.dumps: List[Dump] = []
        self.cur: Optional[Dump] = None  # current dump
        self.thread: Optional[Thread] = None  # current thread (frames go there)
        self.prev_blank = True  # the previous line was blank
        self.saw_other = False  # unknown text since the last thread line
        self.pending_header: Optional[str] = None  # "Fatal Python error: ..." waiting for its first thread

    def feed(self, line: str) -> None:
        """One line of the file (without its line end)."""
        m = _THREAD_RE.match(line)
        stack_line = m is None and _STACK_RE.match(line) is not None
        if m or stack_line:
            self._thread_line(m)
            return
        stripped = line.strip()
        if not stripped:
            self.prev_blank = True
            return
        self.prev_blank = False
        self._body_line(line, stripped)

    def _thread_line(self, m: Optional[re.Match[str]]) -> None:
        """A thread line (``m``, its match) or a "Stack" line (``m`` None): a new thread,
        in a new dump unless it continues the current one."""
        tid = int(m.group("tid"), 16) if m else None
        cur = self.cur
        if cur is None or self._new_dump(cur, tid):
            cur = self.cur = {"header": self.pending_header, "threads": [], "truncated": False}
            self.dumps.append(cur)
            self.pending_header = None
        self.thread = {
            "thread_name": (m.group("name") if m else None) or None,
            "thread_id": tid,
            "os_thread_id": None,
            "active": None,
            "owns_gil": None,
            "current": m is None or m.group("cur") != "Thread",
            "frames": [],
        }
        cur["threads"].append(self.thread)
        self.prev_blank = self.saw_other = False

    def _new_dump(self, cur: Dump, tid: Optional[int]) -> bool:
        """True when a thread line with id ``tid`` (None: a "Stack" line) starts a new dump
        after ``cur``."""
        return (
            tid is None
            or self.pending_header is not None
            or self.saw_other
            or not self.prev_blank
            or any(t["thread_id"] == tid for t in cur["threads"])
        )

    def _body_line(self, line: str, stripped: str) -> None:
        """A non-blank line that is no thread line: a frame, a marker, or other text."""
        thread = self.thread
        fm = _FRAME_RE.match(line)
        if fm and thread is not None:
            ln = fm.group("line")
            thread["frames"].append(
                {
                    "name": fm.group("name"),
                    "filename": fm.group("file"),
                    "line": int(ln) if ln.isdigit() else 0,
                    "native": False,
                }
            )
        elif stripped == "..." and thread is not None and self.cur is not None:  # cur is set with thread
            self.cur["truncated"] = True
        elif stripped == "<no Python frame>" and thread is not None:
            pass
        elif line[:1].isspace() and thread is not None:
            pass  # other indented detail inside a thread (e.g. "  Garbage-collecting")
        elif _FATAL_RE.match(stripped):
            self.pending_header = stripped
            self.thread = None
        else:
            # other text ("Extension modules: ...", a marker line): the dump is over
            self.thread = None
            self.saw_other = True


def parse_faulthandler_text(text: Union[str, bytes]) -> List[Thread]:
    """Threads of the **last** dump in ``text`` (thread format above); [] when there is none.

    See :func:`parse_faulthandler_dumps` for every dump in the file.
    """
    dumps = parse_faulthandler_dumps(text)
    return dumps[-1]["threads"] if dumps else []
