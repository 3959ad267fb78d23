"""Rule *dead_rank* -> 'dead-rank' with the death's cause (``analyze/failures/deaths.py``).

The root is the earliest non-victim death; every other failure (dead ranks, failed
records) goes to ``cascade``.

*A mismatch that killed* (issue 9): gloo aborts the rank that receives more data than
it expects (SIGABRT, "Received data size doesn't match expected size", DESIGN.md) and its
peers then fail with a connection error. When the root died of a fatal signal and the
members' records at its newest collective's (group, seq) carry two or more signatures
(op, dtype, numel, root), the verdict is 'collective-mismatch' (cause 'mismatch') naming
the rank that changed (``analyze/graph/sigclasses.py``: the minority, else the one class whose
signature is new on the group, else each rank's own history, ``analyze/graph/history.py``),
else the dead rank; every signature with its ranks and the signal are evidence. A rank
SIGABRTed in a collective its peers never made (they failed with a transport error in a
collective torch issued itself, DDP's bucket all-reduce) is that mismatch too
(``analyze/graph/sizeabort.py``, ``details['size_abort']``): gloo's sentence is evidence,
the abort and the peers' connection errors its consequence, never a 'fatal-signal' death. Whether the death or a hang is the verdict is the
arbiter's decision table (``analyze/arbiter.py``). The group/seq shown are those of the
instance with the most waiters that misses the root, else the root's newest collective.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from hangtrace.tracer.analyze.graph import sigclasses, sizeabort
from hangtrace.tracer.analyze.failures import teardown
from hangtrace.tracer.analyze.context import Ctx
from hangtrace.tracer.analyze.rankview import RankView
from hangtrace.tracer.analyze.failures.deaths import failures, roots
from hangtrace.tracer.analyze.failures.departures import sigterm_before
from hangtrace.tracer.analyze.evidence import (
    fill_common,
    frames_from_exception,
    frames_of,
    handled_sigterm,
    rank_line,
    rk,
    torch_count,
    ts,
    vb,
)
from hangtrace.tracer.stackmodel.usercode import user_frame
from hangtrace.tracer.analyze.failures.exceptions import short_error
from hangtrace.tracer.analyze.stuck.stacktree import frame_label
from hangtrace.tracer.analyze.rules.base import Finding
from hangtrace.tracer.analyze.graph.threadgroups import group_threads
from hangtrace.tracer.analyze.failures.attempts import restarts
from hangtrace.tracer.analyze.stuck.stacktree import format_ranks
from hangtrace.tracer.analyze.graph.waitgraph import Inst, inst_text
from hangtrace.tracer.diagnosis import Cause, Diagnosis, Kind

NAME = "dead_rank"


def find(ctx: Ctx) -> Optional[Finding]:
    """The root death (``data``: (root view, every root, failures)), or None."""
    rs = roots(ctx)
    if not rs:
        return None
    return Finding(NAME, (rs[0].rank,), rs[0].fail_wall, data=(rs[0], rs, failures(ctx)))


def _abort_mismatch(ctx: Ctx, root: RankView) -> Optional[Dict[str, Any]]:
    """The members' records at the fatally signalled root's last collective when they carry
    two or more signatures: {'rec', 'group', 'recs' (rank -> record), 'sigs'}, or None."""
    if root.cause != "fatal-signal" or not root.last:
        return None
    g, rec = max(root.last.items(), key=lambda kv: kv[1].get("idx") or 0)
    if not isinstance(rec.get("seq"), int):
        return None
    recs = sigclasses.records_at(ctx, g, rec["seq"])
    recs[root.rank] = rec
    sigs = sigclasses.classes(recs)
    if len(sigs) < 2:
        return None
    return {"rec": rec, "group": g, "recs": recs, "sigs": sigs}


def _abort_culprits(ctx: Ctx, root: RankView, mm: Dict[str, Any]) -> Tuple[List[int], str]:
    """Who changed (``sigclasses.changed``), else the aborted rank, with the deciding line."""
    return sigclasses.changed(
        ctx,
        mm["group"],
        mm["rec"]["seq"],
        mm["recs"],
        fallback=(
            [root.rank],
            "no majority and no earlier record of the group decides which rank changed: "
            "the rank gloo aborted is named",
        ),
    )


def _explain_abort_mismatch(
    ctx: Ctx, root: RankView, mm: Dict[str, Any], d: Diagnosis, culprits: List[int], how: str
) -> None:
    rec = mm["rec"]
    d.kind, d.cause = Kind.COLLECTIVE_MISMATCH, Cause.MISMATCH
    g = rec.get("group")
    d.group, d.group_ranks, d.seq = g, list(ctx.members(g)) or None, rec.get("seq")
    d.op = mm["recs"][culprits[0]].get("op") if culprits[0] in mm["recs"] else rec.get("op")
    d.details["cause_text"] = root.cause_text
    d.details["group_desc"] = (ctx.groups.get(g) or {}).get("desc")
    d.details["signatures"] = sigclasses.describe(ctx, g, rec.get("seq"), mm["recs"], culprits)
    sigclasses.at_call(d, mm["recs"].get(culprits[0]))
    ctx.add(how)
    early = sigclasses.earlier_line(ctx, g, rec.get("seq"))
    if early:
        ctx.add(early)
    if sizeabort.aborted(root):
        peers = sizeabort.failed_peers(ctx, root, g)
        d.details["size_abort"] = {
            "rank": root.rank,
            "peers": peers,
            "text": sizeabort.GLOO_SIZE_CHECK,
            "how": how,
        }
        ctx.add(sizeabort.consequence_line(ctx, root, g, peers))
    else:
        ctx.add(
            "rank %d died of a fatal signal in it (%s): gloo aborts the rank that receives more data than it "
            "expects (the smaller tensor), which is not always the rank that changed"
            % (root.rank, (root.cause_text or "")[:160])
        )


def _explain_unmatched(ctx: Ctx, root: RankView, uc: sizeabort.Unmatched, d: Diagnosis) -> None:
    """A size-check abort at a call the peers never made (``graph/sizeabort.py``)."""
    rec = uc.rec
    fill_common(ctx, d, list(uc.culprits), None)
    d.kind, d.cause = Kind.COLLECTIVE_MISMATCH, Cause.MISMATCH
    d.group, d.group_ranks, d.seq, d.op = (
        uc.group,
        list(ctx.members(uc.group)) or None,
        rec.get("seq"),
        rec.get("op"),
    )
    d.details["cause_text"] = root.cause_text
    d.details["group_desc"] = (ctx.groups.get(uc.group) or {}).get("desc")
    d.details["size_abort"] = {
        "rank": root.rank,
        "call": uc.call,
        "peers": list(uc.peers),
        "text": sizeabort.GLOO_SIZE_CHECK,
        "how": uc.line,
    }
    sigclasses.at_call(d, rec)
    ctx.add(uc.line)
    for line in uc.peer_lines:
        ctx.add(line)
    ctx.add(sizeabort.consequence_line(ctx, root, uc.group, list(uc.peers)))


def _where_it_stopped(ctx: Ctx, d: Diagnosis, root: RankView) -> Optional[Inst]:
    """The instance the most waiters wait in that misses the root (returned), and the
    group/seq the verdict shows: that instance's, or the root's own newest collective when
    there is none or when the waiters' seq is torch's count and the root's ours (a dead
    rank has no Flight Recorder dump: the two numbers do not compare; blind job
    tr_dl_oom, 2026-12-02: "during/after all_reduce seq 30" for a rank whose last was 12)."""
    inst: Optional[Inst] = None
    for i in ctx.insts.values():
        if root.rank in i.missing and (inst is None or len(i.waiters) > len(inst.waiters)):
            inst = i
    other_count = (
        inst is not None
        and any(torch_count(ctx.blocked(w)) for w in inst.waiters)
        and not torch_count(root.last.get(inst.group))
    )
    fill_common(ctx, d, [root.rank], None if other_count else inst)
    if inst is not None:
        d.details["direct_waiters"] = sorted(inst.waiters)
        if not other_count:
            mine = root.last.get(inst.group)
            if mine is not None and not inst.p2p and int(mine.get("seq") or 0) < int(inst.seq or 0):
                d.details["root_last_seq"] = mine.get("seq")  # it died before reaching the waiters' seq
            return inst
        d.details["waiters_seq"] = "torch"
    b = root.blocked or root.last_rec
    if root.last:
        g = max(root.last.items(), key=lambda kv: kv[1].get("idx") or 0)[0]
        rec = root.last[g]
        d.group, d.group_ranks, d.seq, d.op = g, list(ctx.members(g)) or None, rec.get("seq"), rec.get("op")
    elif b:
        d.op = b.get("op")
    return inst


def explain(ctx: Ctx, finding: Finding, d: Diagnosis) -> None:
    """Cause, failure time, the root's last collective, its waiters, the cascade;
    ``details['cause_text']``, ``['fail_wall_ns']``."""
    root: RankView
    all_roots: List[RankView]
    fails: List[Dict[str, Any]]
    root, all_roots, fails = finding.data
    if root.departed:  # it left first: no death (analyze/failures/departures.py)
        _explain_departure(ctx, d, root, all_roots, fails)
        return
    mm = _abort_mismatch(ctx, root)
    uc = sizeabort.unmatched(ctx, root) if mm is None else None
    if uc is not None:  # gloo's size check aborted it at a call its peers never made
        _explain_unmatched(ctx, root, uc, d)
        d.cascade = [c for c in fails if c["rank"] not in uc.culprits]
        return
    if mm is not None:
        culprits, how = _abort_culprits(ctx, root, mm)
        fill_common(ctx, d, culprits, None)
        _explain_abort_mismatch(ctx, root, mm, d, culprits, how)
        group_threads(ctx, d, mm["recs"].get(culprits[0]))  # two threads on one group (blind helper 67)
        d.cascade = [c for c in fails if c["rank"] not in culprits]
        return
    d.kind = Kind.DEAD_RANK
    d.cause = root.cause
    d.details["cause_text"] = root.cause_text
    d.details["fail_wall_ns"] = root.fail_wall
    inst = _where_it_stopped(ctx, d, root)
    p = root.proc
    frames_from_exception(d, p)  # (no stack of a dead rank: where its exception was raised)
    state = p.state + (" exit code %s" % p.exit_code if p.exit_code is not None else "")
    if p.state == "alive" and p.exit_code is not None:  # (its exit record is written; the pid lives on)
        state = "exiting (exit code %s recorded; the process was still tearing down)" % p.exit_code
    ctx.add("rank %d (%s): %s; cause %s: %s" % (root.rank, p.key, state, root.cause, root.cause_text))
    if root.fail_wall:
        ctx.add(
            "rank %d failed first (at %s%s)"
            % (
                root.rank,
                ts(root.fail_wall),
                ", its last sign of life"
                if (root.mem or {}).get("base_cause", root.cause) == "killed-without-record"
                else "",
            )
        )
    if d.group is not None:
        ctx.add(rank_line(ctx, root.rank, d.group))
    if inst is not None:
        ctx.add(
            "%s %s at %s for it%s"
            % (
                rk(inst.waiters),
                vb(inst.waiters),
                inst_text(ctx, inst),
                (
                    " (torch's count, from the Flight Recorder: it counts C++-issued collectives such as DDP's "
                    "gradient all-reduce; rank %d's seq is hangtrace's count of Python calls)" % root.rank
                )
                if d.details.get("waiters_seq") == "torch"
                else "",
            )
        )
    restarts(ctx, d, root)  # the same failure in every attempt of a restarted rank (blind helper 68)
    d.cascade = [c for c in fails if c["rank"] != root.rank]
    td = teardown.details(ctx, root)  # the SIGTERMs after it failed: Ray stopping the job (teardown.py)
    if td:
        d.details["teardown"] = td
    if d.cascade:
        vict = [c for c in d.cascade if c.get("victim")]
        ctx.add(
            "%d later failure(s) (cascade)%s: first rank %d (%s)"
            % (
                len(d.cascade),
                ", %d transport error(s)" % len(vict) if vict else "",
                d.cascade[0]["rank"],
                (d.cascade[0]["text"] or d.cascade[0]["cause"])[:120],
            )
        )
    if len(all_roots) > 1:
        ctx.add(
            "other non-transport deaths after the root: ranks %s"
            % format_ranks([v.rank for v in all_roots[1:]], 12)
        )


def _explain_departure(
    ctx: Ctx, d: Diagnosis, root: RankView, all_roots: List[RankView], fails: List[Dict[str, Any]]
) -> None:
    """'skipped-collective' / 'skipped' for the rank that left first (``root.departed``);
    ``details['departed']``: {'rank', 'exit_wall_ns', 'text', 'after' (its peers' failures),
    'sigterm' (the SIGTERM before its exit, or absent)}."""
    d.kind, d.cause = Kind.SKIPPED_COLLECTIVE, Cause.SKIPPED
    _where_it_stopped(ctx, d, root)
    p = root.proc
    d.cascade = [c for c in fails if c["rank"] != root.rank]
    first = d.cascade[0] if d.cascade else None
    dep: Dict[str, Any] = {
        "rank": root.rank,
        "exit_wall_ns": root.fail_wall,
        "text": "its program returned (exit code 0) at %s while its peers still ran the job"
        % ts(root.fail_wall),
    }
    ctx.add("rank %d (%s): %s" % (root.rank, p.key, dep["text"]))
    if d.group is not None:
        ctx.add(rank_line(ctx, root.rank, d.group))
    if first is not None:
        later = sorted({c["rank"] for c in d.cascade})
        dep["after"] = (
            "%.1f s later %s failed (rank %d: %s): their connections to rank %d closing, not the network"
            % (
                ((first["wall_ns"] or 0) - root.fail_wall) / 1e9,
                rk(later, 8),
                first["rank"],
                short_error(first.get("text")) or first.get("cause"),
                root.rank,
            )
        )
        ctx.add("after it: " + dep["after"])
    sig = sigterm_before(root)
    if sig is not None:
        labels, frames, _thread = frames_of(ctx, root.rank)
        f = user_frame(frames or [])
        at = frame_label(f) if f is not None else (labels[0] if labels else "")
        dep["sigterm"] = handled_sigterm(sig, at, root.fail_wall)
        ctx.add("it " + dep["sigterm"])
    d.waiting_ranks = [w for w in d.waiting_ranks if w in ctx.views and not ctx.views[w].dead]
    d.details["departed"] = dep
    d.details["cause_text"] = root.cause_text
    if len(all_roots) > 1:
        ctx.add("deaths after it: ranks %s" % format_ranks([v.rank for v in all_roots[1:]], 12))
