"""The source lines of blocked threads' frames, read where the job's files are (impure: reads
the files; never raises).

A thread blocked in C code called from a line (``with lock:``, a C-level ``Lock.acquire``)
has that line as its innermost frame and nothing else to say what it waits for; the ``with``
blocks a frame's line is inside say which locks the thread already holds (a lock-order
deadlock: blind helper 53). Called on py-spy's threads by ``collect/stacks.py``.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple

#: longest source line kept (characters)
_CODE_CHARS = 160


def add_source_lines(threads: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Each thread gets ``'code'`` on its innermost Python frame, and on
    the innermost frame of the user's own code (not a library's: ``stackmodel/usercode.LIBRARY_PATHS``): that
    line of its source file, stripped (at most 160 characters), when the file is readable
    here. Why: a thread blocked in C code called from that line (``with lock:``, a C-level
    ``Lock.acquire``) has that line as its innermost frame and nothing else to say what it
    waits for. Also on the user's innermost frames: ``'with'`` (the ``with`` blocks the
    line is inside), ``'loop'`` (the innermost ``while`` around it: a polling loop) and, on
    the innermost, ``'next'`` (the lines after it in its function). The same list, changed
    in place. Never raises."""
    import linecache
    from hangtrace.tracer.stackmodel.usercode import (
        user_code as mine,
    )  # (not a library's, not our hooks' wrappers)

    for t in threads:
        try:
            py = [f for f in t.get("frames") or () if not f.get("native")]
            user = next((f for f in py if mine(f)), None)
            for fr in py[:1] + ([user] if user is not None and py[:1] != [user] else []):
                if not fr.get("line") or not os.path.isfile(str(fr.get("filename"))):
                    continue
                code = linecache.getline(str(fr["filename"]), int(fr["line"])).strip()
                if "#" in code and not any(q in code.split("#", 1)[0] for q in "'\""):
                    code = code.split("#", 1)[0].rstrip()  # a trailing comment (no string before it)
                if code:
                    fr["code"] = code[:_CODE_CHARS]
            for i, fr in enumerate([f for f in py if mine(f)][:4]):
                path, line = str(fr.get("filename") or ""), int(fr.get("line") or 0)
                held, loop = enclosing_blocks(path, line)
                if held:
                    fr["with"] = held
                if loop and i < 2:  # a polling loop: around the wait, or around the call that waits
                    fr["loop"] = loop
                if i == 0:  # what this thread does once its wait returns (analyze/stuck/pollwait.py)
                    after = following_lines(path, line)
                    if after:
                        fr["next"] = after
        except Exception:  # never lose the stacks for a detail
            continue
    return threads


_WITH_LOOKBACK = 80  # source lines searched above a frame's line for the blocks it is inside


def enclosing_blocks(path: str, line: int) -> Tuple[List[List[Any]], Optional[List[Any]]]:
    """``(withs, loop)`` around line ``line`` of ``path``, found by indentation up to the
    enclosing ``def``/``class`` (at most ``_WITH_LOOKBACK`` lines above): the ``with``
    statements whose block holds the line, innermost first (``[[line, 'with
    metrics_lock:'], ...]``: what a thread waiting at a ``with x_lock:`` line already holds,
    a lock-order deadlock: blind helper 53), and the innermost ``while`` loop around it
    (``[55, 'while not os.path.exists(marker):']``: a thread asleep in a loop polls for its
    condition: blind helper 62), or None. ``([], None)`` when the file is not readable."""
    import linecache

    out: List[List[Any]] = []
    loop: Optional[List[Any]] = None
    if line <= 1 or not os.path.isfile(path):
        return out, loop
    cur = linecache.getline(path, line)
    indent = len(cur) - len(cur.lstrip())
    for n in range(line - 1, max(0, line - _WITH_LOOKBACK), -1):
        text = linecache.getline(path, n)
        body = text.strip()
        if not body or body.startswith("#"):
            continue
        ind = len(text) - len(text.lstrip())
        if ind >= indent:
            continue
        indent = ind
        if body.startswith(("with ", "async with ")) and not body.startswith("with tracer."):  # (our phases)
            out.append([n, body[:_CODE_CHARS]])
        if loop is None and body.startswith("while ") and body.endswith(":"):
            loop = [n, body[:_CODE_CHARS]]
        if body.startswith(("def ", "async def ", "class ")) or ind == 0:
            break
    return out, loop


_NEXT_LINES = 6  # lines kept after a frame's line


def following_lines(path: str, line: int) -> List[List[Any]]:
    """The statements after line ``line`` of ``path`` in its function (at most
    ``_NEXT_LINES``, blank and comment lines skipped, stopping where the function ends):
    ``[[47, 'open(marker, "w").close()'], ...]``. What a rank does once the collective it
    waits in returns: the step the pollers of blind helper 62 waited for. [] when the file
    is not readable here."""
    import linecache

    out: List[List[Any]] = []
    if line <= 0 or not os.path.isfile(path):
        return out
    head = linecache.getline(path, line)
    floor = len(head) - len(head.lstrip())  # the function body's indentation is at most this
    for n in range(line - 1, max(0, line - _WITH_LOOKBACK), -1):
        text = linecache.getline(path, n)
        if text.strip().startswith(("def ", "async def ")):
            floor = len(text) - len(text.lstrip()) + 1
            break
    for n in range(line + 1, line + 40):
        text = linecache.getline(path, n)
        if not text:
            break
        body = text.strip()
        if not body or body.startswith("#"):
            continue
        if len(text) - len(text.lstrip()) < floor:
            break  # the function ended
        out.append([n, body[:_CODE_CHARS]])
        if len(out) >= _NEXT_LINES:
            break
    return out
