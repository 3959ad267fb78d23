"""A mismatch where the culprit's collective was issued by torch itself: did it skip a call?
(pure)

The Flight Recorder numbers every collective torch launches, DDP's gradient all-reduce in
``backward()`` included; our wrappers number the program's Python calls. When the culprit's
record at a mismatch is one only torch saw (C++-issued) while the others wait in a Python
call, the two counts tell what happened: the culprit's own newest Python call on the group is
*before* the one the others wait in, so it never made that call and went on past it (blind
helper 82: rank 2's eval raised, an ``except ...: continue`` skipped its ``all_gather_object``
and ``barrier``, and it went into the next step's backward, where DDP all-reduces).

In: the context, the diagnosis of the mismatch, the instance's waiters and the culprit's
record. Out: ``details['skipped_call']`` (``{'rank', 'op', 'call', 'last_op', 'last_call',
'waiters'}``, calls counted per group from 1 as our wrappers count them) and an evidence line.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence, Tuple

from hangtrace.tracer.analyze.context import FR_JOINED_SOURCE, FR_SOURCE, Ctx, history
from hangtrace.tracer.analyze.evidence import rk
from hangtrace.tracer.diagnosis import Diagnosis


def own_call(rec: Mapping[str, Any]) -> Optional[int]:
    """The number our wrappers gave the Python call of ``rec`` (a joined record keeps it as
    ``seq_ours``; torch-only records have none)."""
    src = rec.get("source")
    if src == FR_SOURCE:
        return None
    n = rec.get("seq_ours") if src == FR_JOINED_SOURCE else rec.get("seq")
    return n if isinstance(n, int) else None


def _last_call(ctx: Ctx, r: int, group: Any) -> Tuple[Optional[int], Optional[str]]:
    last: Tuple[Optional[int], Optional[str]] = (None, None)
    v = ctx.views.get(r)
    for rec in history(v.proc) if v is not None else ():
        n = own_call(rec)
        if rec.get("kind") == "collective" and rec.get("group") == group and n is not None:
            if last[0] is None or n > last[0]:
                last = (n, rec.get("op"))
    return last


def skipped_call(ctx: Ctx, d: Diagnosis, waiters: Sequence[int], crec: Mapping[str, Any]) -> None:
    """Fills the outputs of the module docstring when they apply; never raises on odd data."""
    if crec.get("source") != FR_SOURCE or not d.culprit_ranks or d.group is None:
        return
    r = d.culprit_ranks[0]
    others = [w for w in waiters if w != r and w in ctx.views]
    recs = [ctx.views[w].blocked for w in others]
    calls = {own_call(x) for x in recs if x is not None}
    ops = {x.get("op") for x in recs if x is not None}
    if not others or len(calls) != 1 or None in calls or len(ops) != 1:
        return
    call = calls.pop()
    last, last_op = _last_call(ctx, r, d.group)
    if call is None or last is None or last >= call:
        return
    op = ops.pop()
    d.details["skipped_call"] = {"rank": r, "op": op, "call": call, "last_op": last_op, "last_call": last,
                                 "waiters": sorted(others)}
    ctx.add("rank %d never called %s: %s %s in Python call %d on %s, rank %d's last there was %s (call %d); "
            "the collective it is in was issued by torch itself (%s)" % (
                r, op, rk(others, 8), "waits" if len(others) == 1 else "wait", call, ctx.gdesc(d.group), r,
                last_op, last, crec.get("op")))
