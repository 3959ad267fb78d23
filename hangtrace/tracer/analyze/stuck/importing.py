"""Processes caught inside Python's import machinery: working, not waiting. Pure.

A stall threshold shorter than a start-up sees ranks that import: torch's own import, or a
lazy one on first use (a rank's first optimizer step imported sympy here, over 6 s on a
loaded machine), and Ray actors that import torch in their first method before they join
any group, so the rendezvous waits for ranks that are still starting. Seen in CI: the node
watcher with a 6 s threshold snapshotted four ranks in ``_find_and_load`` and called them
"waiting outside collectives".
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

from hangtrace.tracer.analyze.stuck.stacktree import frame_label, pick_thread
from hangtrace.tracer.snapshot import ProcessInfo

#: importlib's frames (``<frozen importlib._bootstrap>``) that mean "a module is being found
#: or executed" (CPython 3.8-3.13, Lib/importlib/_bootstrap.py).
IMPORT_FUNCS = frozenset({"_find_and_load", "_find_and_load_unlocked", "_load_unlocked", "_gcd_import"})


def import_frame(p: ProcessInfo) -> Optional[str]:
    """The innermost module-level frame (``<module> (file:line)``) of ``p``'s main thread
    when that thread is inside an import (py-spy order: innermost frame first), the
    innermost import frame when no module frame shows; None when it is not importing or
    has no stack."""
    th = pick_thread(p.stacks)
    frames = list((th or {}).get("frames") or [])
    inside = [
        f for f in frames if f.get("name") in IMPORT_FUNCS and "importlib" in str(f.get("filename") or "")
    ]
    if not inside:
        return None
    module = next((f for f in frames if f.get("name") == "<module>"), None)
    return frame_label(module if module is not None else inside[0])


def importing(processes: Sequence[ProcessInfo]) -> Dict[str, str]:
    """{process key: its import frame} of the alive ``processes`` whose main thread is
    inside an import (see :func:`import_frame`)."""
    out: Dict[str, str] = {}
    for p in processes:
        if p.state not in ("alive", "unknown"):
            continue
        where = import_frame(p)
        if where is not None:
            out[p.key] = where
    return out


def importing_line(what: str, where: List[str]) -> str:
    """The evidence line for processes caught importing: ``what`` names them ('ranks 0-3',
    "Trainer 'trainer-1'"), ``where`` their import frames."""
    shown = sorted(set(where))
    return (
        "%s %s inside an import (%s): working, not waiting - a start-up or a first-use import (torch "
        "imports sympy and torch._dynamo lazily) slower than the stall threshold; on a loaded machine "
        "give the start more time (HANGTRACE_STARTUP_STALL_S, --stall-s) and take another snapshot"
        % (
            what,
            "is" if len(where) == 1 else "are",
            "; ".join(shown[:3]) + ("; ..." if len(shown) > 3 else ""),
        )
    )
