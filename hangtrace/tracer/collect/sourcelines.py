"""The source lines of blocked threads' frames, read where the job's files are (impure: reads
the files; never raises).

A thread blocked in C code called from a line (``with lock:``, a C-level ``Lock.acquire``)
has that line as its innermost frame and nothing else to say what it waits for; the ``with``
blocks a frame's line is inside say which locks the thread already holds (a lock-order
deadlock: blind helper 53). Called on py-spy's threads by ``collect/stacks.py``.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List

#: longest source line kept (characters)
_CODE_CHARS = 160


def add_source_lines(threads: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Each thread that is not running gets ``'code'`` on its innermost Python frame, and on
    the innermost frame of the user's own code (not a library's: ``evidence.LIBRARY_PATHS``): that
    line of its source file, stripped (at most 160 characters), when the file is readable
    here. Why: a thread blocked in C code called from that line (``with lock:``, a C-level
    ``Lock.acquire``) has that line as its innermost frame and nothing else to say what it
    waits for. The same list, changed in place. Never raises."""
    import linecache
    from hangtrace.tracer.analyze.evidence import LIBRARY_PATHS
    for t in threads:
        try:
            if t.get("active") is not False:
                continue
            py = [f for f in t.get("frames") or () if not f.get("native")]
            user = next((f for f in py if not any(x in str(f.get("filename") or "") for x in LIBRARY_PATHS)), None)
            for fr in (py[:1] + ([user] if user is not None and py[:1] != [user] else [])):
                if not fr.get("line") or not os.path.isfile(str(fr.get("filename"))):
                    continue
                code = linecache.getline(str(fr["filename"]), int(fr["line"])).strip()
                if "#" in code and not any(q in code.split("#", 1)[0] for q in "'\""):
                    code = code.split("#", 1)[0].rstrip()  # a trailing comment (no string before it)
                if code:
                    fr["code"] = code[:_CODE_CHARS]
            for fr in [f for f in py if not any(x in str(f.get("filename") or "") for x in LIBRARY_PATHS)][:4]:
                held = enclosing_with(str(fr.get("filename") or ""), int(fr.get("line") or 0))
                if held:
                    fr["with"] = held
        except Exception:  # never lose the stacks for a detail
            continue
    return threads


_WITH_LOOKBACK = 80  # source lines searched above a frame's line for the blocks it is inside


def enclosing_with(path: str, line: int) -> List[List[Any]]:
    """The ``with`` statements whose block holds line ``line`` of ``path`` (its function's,
    innermost first): ``[[line, 'with metrics_lock:'], ...]``, found by indentation up to
    the enclosing ``def``/``class`` (at most ``_WITH_LOOKBACK`` lines above). What a thread
    waiting at a ``with x_lock:`` line already holds is the ``with`` blocks it is inside (a
    lock-order deadlock: blind helper 53). [] when the file is not readable here."""
    import linecache
    if line <= 1 or not os.path.isfile(path):
        return []
    cur = linecache.getline(path, line)
    indent = len(cur) - len(cur.lstrip())
    out: List[List[Any]] = []
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
        if body.startswith(("def ", "async def ", "class ")) or ind == 0:
            break
    return out
