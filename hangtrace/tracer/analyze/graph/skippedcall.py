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

from typing import Any, List, Mapping, Optional, Sequence, Tuple

from hangtrace.tracer.analyze.context import Ctx, history
from hangtrace.tracer.ring.frrecords import FR_JOINED_SOURCE, FR_SOURCE
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
    if crec.get("source") != FR_SOURCE and d.culprit_ranks and d.group is not None:
        went_on(ctx, d, waiters, crec)
        return
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
    d.details["skipped_call"] = {
        "rank": r,
        "op": op,
        "call": call,
        "last_op": last_op,
        "last_call": last,
        "waiters": sorted(others),
    }
    ctx.add(
        "rank %d never called %s: %s %s in Python call %d on %s, rank %d's last there was %s (call %d); "
        "the collective it is in was issued by torch itself (%s)"
        % (
            r,
            op,
            rk(others, 8),
            "waits" if len(others) == 1 else "wait",
            call,
            ctx.gdesc(d.group),
            r,
            last_op,
            last,
            crec.get("op"),
        )
    )


def _ops_before(ctx: Ctx, r: int, group: Any, seq: int) -> List[Tuple[int, Any]]:
    """(seq, op) of rank ``r``'s collectives on ``group`` before ``seq``, oldest first."""
    v = ctx.views.get(r)
    out = [
        (int(x["seq"]), x.get("op"))
        for x in (history(v.proc) if v is not None else ())
        if x.get("kind") == "collective"
        and x.get("group") == group
        and isinstance(x.get("seq"), int)
        and x["seq"] < seq
    ]
    return sorted(set(out), key=lambda t: t[0])


def went_on(ctx: Ctx, d: Diagnosis, waiters: Sequence[int], crec: Mapping[str, Any]) -> None:
    """The culprit's own Python call at the mismatch is the op its peers issued just before
    (the group's steady stream: a gradient all_reduce) while they wait in another op they
    had issued as often as it until then (an eval ``all_gather_object``): it went on past
    that op (blind helper 86: a trainer actor's ``compute_metrics`` raised, ``except`` skipped
    its ``all_gather_object`` and it went into the next step's all_reduce). Fills
    ``details['skipped_call']`` (with ``into``: the op it issued instead, ``by_torch``
    False) and an evidence line."""
    case = _went_on_case(ctx, d, waiters, crec)
    if case is None:
        return
    r, op, into, seq, others, mine, theirs = case
    count = sum(1 for _s, o in mine if o == op)
    if any(sum(1 for _s, o in t if o == op) != count for t in theirs):
        return
    calls = {own_call(ctx.views[w].blocked or {}) for w in others}
    call = calls.pop() if len(calls) == 1 else None
    last = max((s_ for s_, o in mine if o == op), default=None)
    d.details["skipped_call"] = {
        "rank": r,
        "op": op,
        "call": call if call is not None else seq,
        "last_op": op,
        "last_call": last,
        "waiters": sorted(others),
        "into": into,
        "by_torch": False,
    }
    ctx.add(
        "rank %d never called %s: %s %s in it at seq %s on %s, where rank %d issued %s, the collective %s "
        "issued just before it (%s before it on that group: %d, as many as %s)"
        % (
            r,
            op,
            rk(others, 8),
            "waits" if len(others) == 1 else "wait",
            seq,
            ctx.gdesc(d.group),
            r,
            into,
            rk(others, 8),
            op,
            count,
            rk(others, 8),
        )
    )


#: (culprit, the op its peers wait in, the op it issued, seq, peers, its (seq, op) before,
#: theirs) of ``went_on``
_Case = Tuple[int, Any, Any, int, List[int], List[Tuple[int, Any]], List[List[Tuple[int, Any]]]]


def _went_on_case(ctx: Ctx, d: Diagnosis, waiters: Sequence[int], crec: Mapping[str, Any]) -> Optional[_Case]:
    """``went_on``'s facts when its conditions hold but the counts, else None."""
    if len(d.culprit_ranks) != 1:
        return None  # (a tie: no side to call the one that went on)
    r = d.culprit_ranks[0]
    seq = d.seq if isinstance(d.seq, int) else crec.get("seq")
    others = [w for w in waiters if w != r and w in ctx.views]
    ops = {x.get("op") for x in (ctx.views[w].blocked for w in others) if x is not None}
    into = crec.get("op")
    if not others or len(ops) != 1 or not isinstance(seq, int) or into in ops or not into:
        return None
    op = ops.pop()
    mine = _ops_before(ctx, r, d.group, seq)
    theirs = [_ops_before(ctx, w, d.group, seq) for w in others]
    if not mine or any(not t or t[-1][1] != into for t in theirs):
        return None  # (they did not issue that op just before: no steady stream it went on in)
    if not _in_stream(ctx, crec, others, d.group, theirs):
        return None
    return r, op, into, seq, others, mine, theirs


def _in_stream(
    ctx: Ctx,
    crec: Mapping[str, Any],
    others: Sequence[int],
    group: Any,
    theirs: Sequence[Sequence[Tuple[int, Any]]],
) -> bool:
    """Is the culprit's record ``crec`` in the stream its peers issued just before (the same
    phase as their records of it, a step no earlier), not a collective of its own phase
    (rank 0 in 'checkpoint' while the others went on to 'rollout': an extra collective, not
    one it went on in)?"""
    for w, t in zip(others, theirs):
        prev = next(
            (
                x
                for x in history(ctx.views[w].proc)
                if x.get("kind") == "collective" and x.get("group") == group and x.get("seq") == t[-1][0]
            ),
            None,
        )
        if prev is None:
            return False
        if prev.get("phase") != crec.get("phase"):
            return False
        ps, cs = prev.get("step"), crec.get("step")
        if isinstance(ps, int) and isinstance(cs, int) and cs < ps:
            return False
    return True
