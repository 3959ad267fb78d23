"""Rule *mismatch* -> 'collective-mismatch', cause 'mismatch' (first: it is definitive).

In an instance, the ranks at the same seq are compared on (op, dtype, numel, root/peer);
numel/dtype are not compared for ops whose sizes legitimately differ per rank (object
ops, all_to_all, gather/scatter). Two or more signatures -> mismatch; the culprits are
the ranks outside the largest signature class. When the largest classes tie (two ranks,
one each), facts of the flight record break the tie (issue 9), in this order:

00. all classes are one op and exactly one class's signature is new on the group at this
   seq (``analyze/graph/sigclasses.py``: a metric all-reduced as float32 at every earlier step,
   now float64 on one rank);
0. exactly one tied class holds ranks that survived an exception since the others began
   to wait (a failed phase, a dead thread, an asyncio task nobody awaited: it took
   another path because of it, e.g. torchtitan's teardown barrier after an exception);
1. each rank's own history (``analyze/graph/history.py``, issue 37): one class's collective
   is new to its loop (or out of its place in the step) while every other class's is the
   one their loops issued at this place in every earlier step; a changed rank outside its
   loop's phases left its loop early (``details['changed_by_history']``);
2. exactly one tied class holds a rank that died of a fatal signal in it (gloo aborts the
   rank that receives more data than it expects: SIGABRT, DESIGN.md; the smaller tensor,
   so this is the weakest fact);
3. exactly one tied rank deviates from the loop's per-step collective count on the group
   (``analyze/graph/stepcounts.py``: it issued one more, or one fewer, than in every earlier
   step; "one more" counts only collectives of the phases the loop's steps used, so a
   rank that left its loop into eval's barrier without a new step did not issue one more);

otherwise every rank is named ("name all", with why history could not decide). P2P: both sides posted the pair seq in the same direction
(send/send, recv/recv) or with different sizes -> mismatch on both ranks. Of several
mismatched instances the one with the most waiters (then the earliest) is shown.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from hangtrace.tracer.analyze.graph import history, sigclasses, sizeabort
from hangtrace.tracer.analyze.context import Ctx
from hangtrace.tracer.analyze.rankview import Record
from hangtrace.tracer.analyze.evidence import desc_rec, fill_common, rk, where_rec
from hangtrace.tracer.analyze.failures.exceptions import RECENT_NS
from hangtrace.tracer.analyze.failures.exceptions import since as exc_since
from hangtrace.tracer.analyze.failures.exceptions import survived
from hangtrace.tracer.analyze.graph.stepcounts import tie_breaker
from hangtrace.tracer.analyze.graph.skippedcall import skipped_call
from hangtrace.tracer.analyze.graph.threadgroups import group_threads
from hangtrace.tracer.analyze.rules.base import Finding
from hangtrace.tracer.analyze.stuck.stacktree import format_ranks
from hangtrace.tracer.analyze.graph.waitgraph import Inst, Sig, inst_text
from hangtrace.tracer.diagnosis import Cause, Diagnosis, Kind

NAME = "mismatch"


def find(ctx: Ctx) -> Optional[Finding]:
    """The main mismatched instance (``data``: (main, others)), or None."""
    mism = [i for i in ctx.insts.values() if i.mismatch]
    if not mism:
        return None
    main = max(mism, key=lambda i: (len(i.waiters), -(i.start or 0)))
    return Finding(NAME, (), main.start, data=(main, [i for i in mism if i is not main]))


def _tie_break(
    ctx: Ctx, inst: Inst, tied: List[List[int]], hist: Optional[history.Decision]
) -> Optional[Tuple[List[int], str]]:
    """The tied class that diverged (see the module doc), with the evidence line, or None."""
    if inst.p2p:
        exp = [(rs, x) for rs in tied for x in (p2p_expected(ctx, inst, rs[0]),) if x]
        if len(exp) == 1:
            return list(exp[0][0]), "tie broken: " + exp[0][1]
    since_wall = inst.start or 0
    with_exc = []
    for rs in tied:
        hits = [(r, x) for r in rs for x in exc_since(survived(ctx.procs[r]), since_wall - RECENT_NS)]
        if hits:
            with_exc.append((rs, hits))
    if len(with_exc) == 1:
        rs, hits = with_exc[0]
        r, x = hits[-1]
        return list(rs), "tie broken: rank %d survived an exception that changed its path: %s" % (r, x.line())
    if hist is not None and hist.decided:
        return hist.culprits, history.HISTORY_PREFIX + hist.text
    aborted = [
        rs for rs in tied if any(ctx.views[r].dead and ctx.views[r].cause == "fatal-signal" for r in rs)
    ]
    if len(aborted) == 1:
        r = next(r for r in aborted[0] if ctx.views[r].dead)
        return list(aborted[0]), (
            "tie broken: rank %d died of a fatal signal in it (%s): gloo aborts the rank "
            "that receives more data than it expects" % (r, (ctx.views[r].cause_text or "")[:120])
        )
    if all(len(rs) == 1 for rs in tied):
        dev = tie_breaker(ctx.procs, inst.group, [rs[0] for rs in tied])
        if dev is not None:
            return [dev.rank], "tie broken by the per-step collective count: %s" % dev.line()
    return None


_DIRECTION = {
    "send": "send",
    "isend": "send",
    "send_object_list": "send",
    "recv": "recv",
    "irecv": "recv",
    "recv_object_list": "recv",
}


def p2p_expected(ctx: Ctx, inst: Inst, r: int) -> Optional[str]:
    """Of a p2p pair whose two sides posted the same direction: the text saying that a
    third rank posted the opposite op toward ``r`` and waits for it, which ``r`` never
    matched (its own newest p2p with that rank has a lower pair seq): ``r`` most likely
    picked the wrong peer (blind helper 63: stage 2 posts its gradient ``irecv`` from rank 1
    while rank 3's ``isend`` to it stays in flight). None when no rank does."""
    mine = _rec_at(ctx, inst, r) or {}
    way = _DIRECTION.get(str(mine.get("op")))
    pair = {r} | set(inst.waiters) | {inst.peer}
    if way is None:
        return None
    found = []
    for q, v in sorted(ctx.views.items()):
        rec = v.p2p.get((inst.group, r))
        if q in pair or rec is None or rec.get("state") != "issued":
            continue
        if _DIRECTION.get(str(rec.get("op"))) in (None, way):
            continue
        own = ctx.views[r].p2p.get((inst.group, q)) or {}
        if (own.get("seq") or 0) < (rec.get("seq") or 0):
            found.append((q, rec, own))
    if not found:
        return None
    q, rec, own = found[0]
    peer = inst.peer if r in inst.waiters else inst.waiters[0]
    verb = {"send": "sends to", "recv": "receives from"}
    other = _DIRECTION[str(rec.get("op"))]
    return (
        "rank %d %s rank %d (its %ss up to pair seq %s on %s, in flight) and rank %d posted no %s for it (its "
        "newest with rank %d: %s): rank %d %s rank %d instead, most likely the wrong peer"
        % (
            q,
            "sends to" if other == "send" else "waits to receive from",
            r,
            rec.get("op"),
            rec.get("seq"),
            ctx.gdesc(inst.group),
            r,
            "receive" if way == "recv" else "send",
            q,
            "%s pair seq %s" % (own.get("op"), own.get("seq")) if own else "none",
            r,
            verb[way],
            peer,
        )
    )


def _culprits(ctx: Ctx, inst: Inst, sigs: Dict[Sig, List[int]]) -> Tuple[List[int], Optional[str]]:
    minority = sigclasses.majority(sigs)  # the ranks outside the one largest signature class
    if minority is not None:
        return minority, None
    recs = {r: rec for rs in sigs.values() for r in rs for rec in (_rec_at(ctx, inst, r),) if rec}
    new = (
        None
        if inst.p2p or len(recs) < sum(map(len, sigs.values()))
        else sigclasses.novelty(ctx, inst.group, inst.seq, sigs, recs)
    )
    if new is not None:
        return new[0], "tie broken: " + new[1]
    top = max(map(len, sigs.values()))
    tied = [sorted(rs) for rs in sigs.values() if len(rs) == top]
    hist = None
    if not inst.p2p and len(recs) == sum(map(len, sigs.values())):
        hist = history.decide(ctx, inst.group, recs, [sorted(rs) for rs in sigs.values()])
    broken = _tie_break(ctx, inst, tied, hist)
    if broken is not None:
        return broken
    return (
        [r for rs in sigs.values() for r in rs],
        "no majority: %d signatures with %d rank(s) each; %s%s"
        % (len(tied), top, hist.text if hist is not None else "naming all", _step_skew(ctx, inst, sigs)),
    )


def _step_skew(ctx: Ctx, inst: Inst, sigs: Dict[Sig, List[int]]) -> str:
    """When the tied ranks stand at the same seq in different steps: ' - rank 1 is at
    step 4 (phase train), rank 0 at step 3 (phase eval): they ran different numbers of
    steps ...' (uneven data per rank, or a rank that left its loop early: which one is
    wrong is the job's to say), else ''."""
    at: List[Tuple[int, int, Any]] = []
    for rs in sigs.values():
        for r in rs:
            rec = _rec_at(ctx, inst, r) or {}
            if rec.get("step") is not None:
                at.append((int(rec["step"]), r, rec.get("phase")))
    if len({s for s, _, _ in at}) < 2:
        return ""
    at.sort(reverse=True)
    return (
        " - %s: they ran different numbers of steps before this collective (uneven data per rank, "
        "e.g. a sampler without drop_last or an iterable dataset, or a rank that left its loop early)"
        % ", ".join(
            "rank %d at step %d%s" % (r, st, " (phase %s)" % ph if ph else "") for st, r, ph in at[:4]
        )
    )


def _rec_at(ctx: Ctx, inst: Inst, r: int) -> Optional[Record]:
    """The record rank ``r`` posted at the instance."""
    v = ctx.views[r]
    if r in inst.waiters:
        return v.blocked
    if inst.p2p:
        return v.p2p.get((inst.group, inst.waiters[0]))
    return v.last.get(inst.group)


def _tie_details(ctx: Ctx, inst: Inst, sigs: Dict[Sig, List[int]], tie_note: str, d: Diagnosis) -> None:
    """The tie's evidence line and its details: ``changed_by_history`` (issue 37), ``p2p_expected``."""
    ctx.add(tie_note)
    if tie_note.startswith(history.HISTORY_PREFIX):
        recs = {r: rec for rs in sigs.values() for r in rs for rec in (_rec_at(ctx, inst, r),) if rec}
        dec = history.decide(ctx, inst.group, recs, [sorted(rs) for rs in sigs.values()])
        d.details["changed_by_history"] = history.details(dec)
    if inst.p2p and tie_note.startswith("tie broken") and "most likely the wrong peer" in tie_note:
        d.details["p2p_expected"] = tie_note[len("tie broken: ") :]


def _size_abort(ctx: Ctx, inst: Inst, sigs: Dict[Sig, List[int]], how: Optional[str], d: Diagnosis) -> None:
    """A member SIGABRTed in it (gloo's size check, ``graph/sizeabort.py``) after the hang
    began: ``details['size_abort']`` and the line saying the abort is a consequence."""
    for r in sorted(r for rs in sigs.values() for r in rs):
        v = ctx.views.get(r)
        if v is not None and v.dead and sizeabort.aborted(v):
            peers = sizeabort.failed_peers(ctx, v, inst.group)
            d.details["size_abort"] = {
                "rank": r,
                "peers": peers,
                "text": sizeabort.GLOO_SIZE_CHECK,
                "how": how or "",
            }
            ctx.add(sizeabort.consequence_line(ctx, v, inst.group, peers))
            return


def explain(ctx: Ctx, finding: Finding, d: Diagnosis) -> None:
    """Signatures per rank class, the minority marked; ``details['signatures']``."""
    inst, others = finding.data
    sigs: Dict[Sig, List[int]] = inst.mismatch
    culprits, tie_note = _culprits(ctx, inst, sigs)
    broken = tie_note is not None and tie_note.startswith("tie broken")
    d.kind = Kind.COLLECTIVE_MISMATCH
    fill_common(ctx, d, culprits, inst)
    crec = _rec_at(ctx, inst, d.culprit_ranks[0]) or {}
    d.op = crec.get("op") or d.op
    sigclasses.at_call(d, crec)
    d.cause = Cause.MISMATCH
    where: Dict[Sig, Tuple[Any, Any]] = {}
    for k, rs in sorted(sigs.items(), key=lambda kv: -len(kv[1])):
        rec = _rec_at(ctx, inst, rs[0]) or {}
        where[k] = (rec.get("phase"), rec.get("step"))
        ctx.add(
            "%s at %s: %s (%s)%s%s"
            % (
                rk(rs, 8),
                inst_text(ctx, inst),
                desc_rec(rec),
                rec.get("state"),
                " in " + where_rec(rec) if where_rec(rec) else "",
                " [minority]"
                if set(rs) & set(culprits) and not tie_note
                else " [diverged]"
                if set(rs) & set(culprits) and broken
                else "",
            )
        )
    if tie_note:
        _tie_details(ctx, inst, sigs, tie_note, d)
    _size_abort(ctx, inst, sigs, tie_note, d)
    if inst.p2p and inst.waiters:
        d.details["p2p_pair"] = sorted({inst.waiters[0], inst.peer})
    group_threads(
        ctx, d, crec
    )  # two threads of the culprit issue collectives on this group (blind helper 67)
    if not inst.p2p:  # a C++-issued collective of the culprit against a Python call it never made (helper 82)
        skipped_call(ctx, d, inst.waiters or [r for rs in sigs.values() for r in rs], crec)
    early = None if inst.p2p else sigclasses.earlier_line(ctx, inst.group, inst.seq)
    if early:
        ctx.add(early)
    if inst.behind or inst.nofile:
        ctx.add(
            "also not at this seq: behind %s; no file %s"
            % (format_ranks(inst.behind, 8), format_ranks(inst.nofile, 8))
        )
    d.details["signatures"] = [
        {
            "op": k[0],
            "dtype": k[1],
            "numel": k[2],
            "peer": k[3],
            "ranks": sorted(rs),
            "phase": where.get(k, (None, None))[0],
            "step": where.get(k, (None, None))[1],
        }
        for k, rs in sigs.items()
    ]
    for i in others[:5]:
        ctx.add(
            "another mismatch: %s (ranks %s)"
            % (inst_text(ctx, i), format_ranks([r for rs in (i.mismatch or {}).values() for r in rs], 8))
        )
