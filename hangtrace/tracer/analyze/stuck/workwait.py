"""A rank that waits for its own async collective or p2p op in ``Work.wait()`` (pure).

``req = dist.irecv(...); req.wait()``: the wait is C++ (``torch._C._distributed_c10d.Work``),
so the rank's stack shows no torch.distributed frame, only the user's line that calls
``.wait(``, and its record is async (``async_op``) and still 'issued', which the index
does not count as blocked (an async op in flight is no wait by itself). Blind helper 63:
a pipeline whose stage 2 posts its backward ``irecv`` from rank 1 instead of rank 3; ranks
0-2 were "not in any collective" and the p2p wait-for graph was never built.

In: a rank view (its summary's newest records per group and per peer, its main thread's
frames with the source line of ``collect/sourcelines.py``). Out: the record it waits for,
or None.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from hangtrace.tracer.analyze.stuck.stacktree import process_frames
from hangtrace.tracer.ring.summary import record_key

if TYPE_CHECKING:
    from hangtrace.tracer.analyze.rankview import RankView

#: a source line that waits for a torch ``Work`` (or a list of them) in C++
_WAIT_LINE = re.compile(r"\.wait\(|\bwait_all\(")
_RECV = frozenset({"irecv", "recv", "recv_object_list"})


def async_wait(v: "RankView") -> Optional[Dict[str, Any]]:
    """The async record ``v``'s rank waits for in ``Work.wait()``: its main thread is idle
    (py-spy: not active) with its innermost Python frame at a line that calls ``.wait(``
    or ``wait_all(``, and it has async collective/p2p records still 'issued': the oldest
    receive among them (a send can stay in flight while the rank waits for its receive),
    else the oldest. None otherwise (or when the rank is already blocked)."""
    if v.blocked is not None:
        return None
    frames, th = process_frames(v.proc)
    if not frames or (th or {}).get("active") is not False:
        return None
    if not _WAIT_LINE.search(str(frames[0].get("code") or "")):
        return None
    sm = v.proc.summary
    if sm is None:
        return None
    seen: Dict[Any, Dict[str, Any]] = {}
    for r in (*sm.by_peer.values(), *sm.by_group.values()):
        if (
            isinstance(r, dict)
            and r.get("state") == "issued"
            and r.get("async_op")
            and r.get("kind") in ("p2p", "collective")
        ):
            seen.setdefault(record_key(r), r)
    pend: List[Dict[str, Any]] = list(seen.values())
    if not pend:
        return None
    recv = [r for r in pend if r.get("op") in _RECV]
    return min(recv or pend, key=lambda r: (r.get("t_wall_ns") or 0, r.get("idx") or 0))
