"""The thread format every stack source produces, and pure helpers on it.

In: py-spy's ``dump --json`` output (:func:`normalize_pyspy`), or threads already in the
format below (faulthandler's, parsed by ``stackmodel/faulthandler_text.py``). Out: threads
in the format below, frame labels (:func:`frame_str`), a source-independent frame
identity (:func:`frame_key`), a thread list's main thread and its innermost frames. Pure:
no I/O, no processes; collection (``collect/stacks.py``) and analysis both import it.

Thread format (the one ``snapshot.ProcessInfo.stacks`` holds), for every source::

    {'thread_name': str | None,   # 'MainThread', ...; None when the source does not say
     'thread_id': int | None,     # pthread id (py-spy's thread_id == faulthandler's 0x... id)
     'os_thread_id': int | None,  # Linux TID (py-spy only)
     'active': bool | None,       # py-spy: thread was running (not idle); faulthandler: None
     'owns_gil': bool | None,     # py-spy: thread held the GIL; faulthandler: None
     'current': bool,             # faulthandler: the thread that ran the dump ("Current
                                  #   thread"; for a fatal error, the crashing thread)
     'frames': [{'name': str, 'filename': str, 'line': int, 'native': bool}, ...]}

Frames are **innermost first** (py-spy's order; faulthandler prints "most recent call
first" too). ``line`` is 0 when unknown (native frames, faulthandler's ``???``).
Function names are what the source prints: py-spy shows ``co_qualname`` on Python >= 3.11
(``Queue.get``), faulthandler ``co_name`` (``get``); ``frame_key`` compares both.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional, Tuple, Union

Thread = Dict[str, Any]  # one thread in the format above (what ``ProcessInfo.stacks`` holds)
Frame = Dict[str, Any]  # one of its frames


def normalize_pyspy(data: Union[str, bytes, List[Any]]) -> List[Thread]:
    """py-spy ``dump --json`` output (a list of thread dicts) -> the thread format above.

    py-spy 0.4.3 prints, per thread: ``pid, thread_id, thread_name, os_thread_id, active,
    owns_gil, frames[{name, filename, module, short_filename, line, locals, is_entry,
    is_shim_entry}], process_info`` (checked against a live process; ``module`` is set
    only on native frames, which ``--native`` adds with ``line`` 0). Accepts the JSON text
    or the parsed list. Raises ValueError on anything that is not such a list.
    """
    if isinstance(data, (str, bytes)):
        data = json.loads(data)
    if not isinstance(data, list):
        raise ValueError("py-spy JSON: expected a list of threads, got %s" % type(data).__name__)
    threads: List[Thread] = []
    for t in data:
        if not isinstance(t, dict):
            raise ValueError("py-spy JSON: thread entry is %s" % type(t).__name__)
        frames: List[Frame] = []
        for fr in t.get("frames") or []:
            frames.append(
                {
                    "name": str(fr.get("name") or "?"),
                    "filename": str(fr.get("filename") or fr.get("short_filename") or "?"),
                    "line": int(fr.get("line") or 0),
                    "native": fr.get("module") is not None,
                }
            )
        threads.append(
            {
                "thread_name": t.get("thread_name"),
                "thread_id": t.get("thread_id"),
                "os_thread_id": t.get("os_thread_id"),
                "active": t.get("active"),
                "owns_gil": t.get("owns_gil"),
                "current": False,
                "frames": frames,
            }
        )
    return threads


def is_threading_bootstrap(frame: Dict[str, Any]) -> bool:
    """True for ``threading.py``'s ``_bootstrap``: the outermost frame of every thread
    ``threading.Thread`` started (so a thread without it is the main thread)."""
    return (
        frame["name"] in ("_bootstrap", "Thread._bootstrap")
        and os.path.basename(frame["filename"]) == "threading.py"
    )


def frame_str(frame: Frame, full_path: bool = False) -> str:
    """``'func (file.py:line)'``; the base name of the file unless ``full_path``."""
    fn = frame.get("filename") or "?"
    if not full_path:
        fn = os.path.basename(fn) or fn
    line = frame.get("line") or 0
    return (
        "%s (%s:%d)" % (frame.get("name") or "?", fn, line)
        if line
        else "%s (%s)" % (frame.get("name") or "?", fn)
    )


def frame_key(frame: Frame) -> Tuple[str, int, str]:
    """Source-independent identity of a frame: ``(basename, line, short name)``, where the
    short name drops py-spy's class prefix (``Queue.get`` -> ``get``) so py-spy and
    faulthandler frames compare equal."""
    name = (frame.get("name") or "?").rsplit(".", 1)[-1]
    return (os.path.basename(frame.get("filename") or "?"), frame.get("line") or 0, name)


def main_thread(threads: Optional[List[Thread]]) -> Optional[Thread]:
    """The main thread of a thread list: named 'MainThread', else the one not started by ``threading``
    (outermost frame not ``threading._bootstrap``), else the first; None if empty."""
    if not threads:
        return None
    for t in threads:
        if t.get("thread_name") == "MainThread":
            return t
    for t in threads:
        fr = t.get("frames") or []
        if fr and not is_threading_bootstrap(fr[-1]):
            return t
    return threads[0]


def top_frames(threads: Optional[List[Thread]], n: int = 8, python_only: bool = True) -> List[str]:
    """Up to ``n`` innermost frames of the main thread as :func:`frame_str` strings
    (innermost first). Native frames are skipped unless ``python_only`` is False."""
    t = main_thread(threads or [])
    if t is None:
        return []
    frames = [f for f in t.get("frames") or [] if not (python_only and f.get("native"))]
    return [frame_str(f) for f in frames[:n]]
