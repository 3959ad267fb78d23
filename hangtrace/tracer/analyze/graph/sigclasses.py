"""Which rank changed, when ranks posted different signatures at one collective.

A mismatch is symmetric in the records of one sequence number: rank 0 posted float32 and
rank 1 float64, or 8 elements against 10. Which side *changed* takes facts from outside
that seq, and this module holds the two that need no job knowledge:

* **majority**: with three or more members, the ranks outside the one largest signature
  class changed (two ranks posted 8 elements and one 10: the one);
* **novelty** (a tie, all classes the same op): exactly one class's signature was never
  posted on the group before this seq by any member, while every other class's was. A rank
  that all-reduced its metric as float32 at every earlier step and now sends float64 is the
  one that changed, whichever of the two gloo aborted. Different ops are left alone: a
  rank's first barrier after its loop is new too, and legitimately so.

Then each rank's own history (``graph/history.py``): the rank whose collective its loop
never issued at that place, against a rank waiting in the one every earlier step issued.

gloo aborts the rank that receives more data than it expects (SIGABRT), which is the one
with the *smaller* tensor: the rank that changed only when it shrank (blind jobs of
2026-12-02: 8 against 10 elements, float32 against float64, aborted the rank that had not
changed). So an abort is evidence, and the culprit only when no fact above decides.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from hangtrace.tracer.analyze.context import Ctx, history
from hangtrace.tracer.analyze.graph import history as history_facts
from hangtrace.tracer.analyze.rankview import Record
from hangtrace.tracer.ring.frrecords import FR_JOINED_SOURCE, FR_SOURCE
from hangtrace.tracer.analyze.evidence import desc_rec, rk
from hangtrace.tracer.analyze.graph.waitgraph import Sig, signature
from hangtrace.tracer.diagnosis import Diagnosis


def records_at(ctx: Ctx, group: object, seq: int) -> Dict[int, Record]:
    """Each member's collective record at ``(group, seq)`` in what the snapshot keeps of
    it (rank -> record; members without one are left out)."""
    out: Dict[int, Record] = {}
    for r in ctx.members(group) or sorted(ctx.procs):
        p = ctx.procs.get(r)
        if p is None:
            continue
        for rec in reversed(history(p)):
            if rec.get("kind") == "collective" and rec.get("group") == group and rec.get("seq") == seq:
                out[r] = rec
                break
    return out


def classes(recs: Dict[int, Record]) -> Dict[Sig, List[int]]:
    """Signature -> sorted ranks that posted it."""
    out: Dict[Sig, List[int]] = {}
    for r, rec in sorted(recs.items()):
        out.setdefault(signature(rec), []).append(r)
    return out


def majority(sigs: Dict[Sig, List[int]]) -> Optional[List[int]]:
    """The ranks outside the one largest class, or None when the largest classes tie."""
    sizes = sorted((len(rs) for rs in sigs.values()), reverse=True)
    if len(sizes) < 2 or sizes[0] == sizes[1]:
        return None
    top = max(sigs.values(), key=len)
    return sorted(r for rs in sigs.values() if rs is not top for r in rs)


def novelty(
    ctx: Ctx, group: object, seq: int, sigs: Dict[Sig, List[int]], recs: Dict[int, Record]
) -> Optional[Tuple[List[int], str]]:
    """The one class of one op whose signature is new on ``group`` at ``seq`` (see the
    module doc), with the evidence line; None when that does not single one out."""
    if len(sigs) < 2 or len({k[0] for k in sigs}) != 1:
        return None
    earlier: Dict[Sig, List[int]] = {}
    for r in ctx.members(group) or sorted(ctx.procs):
        p = ctx.procs.get(r)
        if p is None:
            continue
        for rec in history(p):
            s = rec.get("seq")
            if (
                rec.get("kind") == "collective"
                and rec.get("group") == group
                and isinstance(s, int)
                and s < seq
            ):
                earlier.setdefault(signature(rec), []).append(s)
    new = [k for k in sigs if k not in earlier]
    if len(new) != 1 or len(new) == len(sigs):
        return None
    ranks = sigs[new[0]]
    old = next(k for k in sigs if k in earlier)
    seqs = sorted(set(earlier[old]))
    return ranks, (
        "%s posted %s for the first time on %s at seq %s; earlier %s had %s, as %s %s now"
        % (
            rk(ranks, 8),
            desc_rec(recs[ranks[0]]),
            ctx.gdesc(group),
            seq,
            "seq %s" % _seqs(seqs),
            desc_rec(recs[sigs[old][0]]),
            rk(sigs[old], 8),
            "posts" if len(sigs[old]) == 1 else "post",
        )
    )


def _seqs(seqs: List[int]) -> str:
    shown = ", ".join(str(s) for s in seqs[-5:])
    return shown if len(seqs) <= 5 else "... " + shown + " (%d in all)" % len(seqs)


def first_divergence(
    ctx: Ctx, group: Optional[object] = None, before_seq: Optional[int] = None
) -> Optional[Tuple[object, int, Dict[int, Record]]]:
    """The earliest collective (by its first issue time) whose *completed* records, from
    two or more ranks, carry two or more signatures: ``(group, seq, rank -> record)``, or
    None. Only ``group`` and seqs below ``before_seq`` when given. gloo completes some of
    these (a broadcast into a larger buffer, an all_reduce of float32 against int32 of the
    same byte size): the job runs on with wrong data, and a later collective may fail."""
    # torch's numbering (Flight Recorder entries, joined or not) and ours are compared apart:
    # a rank without a Flight Recorder dump counts Python calls, not launches (ring/frrecords.py)
    at: Dict[Tuple[object, int, bool], Dict[int, Record]] = {}
    for r, p in ctx.procs.items():
        for rec in history(p):
            g, s = rec.get("group"), rec.get("seq")
            if (
                rec.get("kind") != "collective"
                or rec.get("state") != "completed"
                or not isinstance(s, int)
                or (group is not None and g != group)
                or (before_seq is not None and s >= before_seq)
            ):
                continue
            at.setdefault((g, s, rec.get("source") in (FR_SOURCE, FR_JOINED_SOURCE)), {})[r] = rec
    best: Optional[Tuple[int, int, Tuple[object, int, bool]]] = None
    for key, recs in at.items():
        if len(recs) > 1 and len(classes(recs)) > 1:
            t = min(int(x.get("t_wall_ns") or 0) for x in recs.values())
            if best is None or (t, key[1]) < best[:2]:
                best = (t, key[1], key)
    return None if best is None else (best[2][0], best[2][1], at[best[2]])


def changed(
    ctx: Ctx,
    group: object,
    seq: int,
    recs: Dict[int, Record],
    fallback: Optional[Tuple[List[int], str]] = None,
) -> Tuple[List[int], str]:
    """Who changed at ``(group, seq)`` by majority, then novelty, then each rank's own
    history (``graph/history.py``); else ``fallback``, else every rank (the line says which
    fact decided, or why history could not)."""
    sigs = classes(recs)
    minority = majority(sigs)
    if minority is not None:
        return minority, "%s posted what the majority did not" % rk(minority, 8)
    new = novelty(ctx, group, seq, sigs, recs)
    if new is not None:
        return new
    hist = history_facts.decide(ctx, group, recs, list(sigs.values()))
    if hist.decided:
        return hist.culprits, history_facts.HISTORY_PREFIX + hist.text
    if fallback is not None:
        return fallback[0], fallback[1] + " (" + hist.text + ")"
    return sorted(recs), "no majority: " + hist.text


def earlier_line(ctx: Ctx, group: object, seq: Optional[int]) -> Optional[str]:
    """An evidence line for the first silently completed mismatch on ``group`` before
    ``seq`` (the divergence began there, not at ``seq``), or None."""
    if not isinstance(seq, int):
        return None
    div = first_divergence(ctx, group, before_seq=seq)
    if div is None:
        return None
    g, s, recs = div
    return "the members already disagreed earlier, at seq %s of %s, and it completed: %s" % (
        s,
        ctx.gdesc(g),
        "; ".join("%s: %s" % (rk(rs, 8), desc_rec(recs[rs[0]])) for rs in classes(recs).values()),
    )


def describe(
    ctx: Ctx, group: object, seq: int, recs: Dict[int, Record], culprits: List[int], state: str = ""
) -> List[Dict[str, object]]:
    """Evidence lines, one per signature with its ranks (those that changed first, marked
    ``[changed]``; ``state`` e.g. ' (completed)' after each), and ``details['signatures']``."""
    out: List[Dict[str, object]] = []
    for rs in sorted(classes(recs).values(), key=lambda rs: (not set(rs) & set(culprits), rs)):
        x = recs[rs[0]]
        out.append(
            {
                "op": x.get("op"),
                "dtype": x.get("dtype"),
                "numel": x.get("numel"),
                "peer": x.get("peer"),
                "ranks": list(rs),
                "phase": x.get("phase"),
                "step": x.get("step"),
            }
        )
        ctx.add(
            "%s at seq %s of %s: %s%s%s"
            % (
                rk(rs, 8),
                seq,
                ctx.gdesc(group),
                desc_rec(x),
                state,
                " [changed]" if set(rs) & set(culprits) else "",
            )
        )
    return out


def at_call(d: Diagnosis, rec: Optional[Record]) -> None:
    """Set the verdict ``d``'s phase and step to those of the culprit's mismatching call
    ``rec`` (where the record has them), not to the culprit's current ones: by the
    collection a Ray actor is back in its task loop and a rank may be past a gloo abort (a
    blind Ray job read "at phase 'train_step'" for an all_reduce issued in phase 'metrics')."""
    if rec:
        if rec.get("phase") is not None:
            d.phase = rec["phase"]
        if rec.get("step") is not None:
            d.step = rec["step"]
