"""Rule *rankless_root* -> 'dead-rank' naming a Ray actor without a rank that failed
beside ranked processes (issue 9): ``culprit_actors`` = the actor, ``culprit_ranks``
empty, the ranks that wait afterwards its cascade.

RL jobs mix ranked trainers (a torch.distributed group) with rank-less actors (rollout
workers, reward models, queues). When a rollout worker segfaults, trainer 0 waits for its
batch outside collectives (``ray.get`` on a queue) and trainer 1 waits for trainer 0 in a
broadcast: the rank rules see only the symptom (rank 0 stuck outside collectives). This
rule finds the rank-less candidate root; whether it is the verdict is the arbiter's
decision table (``analyze/arbiter.py``: it must come before the root rank death, and the
hang, if any, must be one the ranks could be waiting on it for - every chain end blocked
outside collectives or dead; a mismatch or a deadlock among the ranks is theirs).

A failure of a rank-less Ray actor (``Role.RAY_ACTOR``, rank -1; a method that raised and
has not completed since, or its death: ``rules/actors.py``) is a candidate when

1. no rank progressed after it (the ranks' newest progress: a phase, step or collective
   record, or the progress stamp - a failed record is no progress - is no later than the
   failure plus ``ACT_SLACK_NS``; ``ACT_SLACK_KILLED_NS`` for a death without a record,
   whose time is only its last sign of life): the ranks waiting afterwards are its
   cascade. Ranks that went on working did not wait for it (the failure stays in
   ``details.actor_failures``);
2. it happened before the ranks stalled: within ``stall_s`` (the analysis' stall
   threshold, s) of the ranks' newest progress, and - for a SIGTERM, an external SIGTERM
   or a death without a record (``STOP_CAUSES``: how stopping a hung job ends an actor),
   or an exception that names a timeout (a ``ray.get`` that gave up waiting) - within
   ``causes.STOPPED_WAIT_NS`` (10 s, the rule that makes a long-waiting rank's SIGTERM a
   victim).

The earliest candidate is the finding (``data``: (root, later actor failures, slack)).
Processes that are not Ray actors (launchers, rank helpers such as DataLoader workers,
Ray's own processes) are never candidates: their deaths have their own meaning.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from hangtrace.tracer.analyze.stuck.chainends import chain_ends
from hangtrace.tracer.analyze.context import Ctx, history
from hangtrace.tracer.analyze.rankview import RankView, index_process
from hangtrace.tracer.analyze.failures.causes import STOPPED_WAIT_NS, is_transport_raise, raised_phases
from hangtrace.tracer.analyze.failures.deaths import fill_death
from hangtrace.tracer.analyze.failures.teardown import rankless_teardown
from hangtrace.tracer.analyze.evidence import desc_rec, rk, ts, vb
from hangtrace.tracer.analyze.rules import actors
from hangtrace.tracer.analyze.rules.base import Finding
from hangtrace.tracer.diagnosis import Cause, Diagnosis
from hangtrace.tracer.ring.summary import PROGRESS_KINDS

NAME = "rankless_root"

#: A rank whose newest progress is within this many ns after the failure did not act
#: after it (both times are read on one host's wall clock, around separate calls).
ACT_SLACK_NS = 100_000_000
#: The same for a death without a record, whose failure time is the last sign of life
#: (memory samples come every second): a lower bound by up to a sampling interval.
ACT_SLACK_KILLED_NS = 1_500_000_000
#: Causes of how a stopped job's actors end (a victim when long after the ranks stalled).
STOP_CAUSES = (Cause.SIGTERM.value, Cause.SIGTERM_EXTERNAL.value, Cause.KILLED_WITHOUT_RECORD.value)


def rank_progress_ns(v: RankView) -> int:
    """The newest progress of rank ``v`` (ns since the epoch): its newest phase, step or
    collective record that did not fail, or its progress stamp; 0 when none. A failed
    record (the rank dying or raising) is no progress."""
    sm = v.proc.summary
    lp = sm.last_progress if sm is not None else None
    if lp is not None and lp.get("state") != "failed":
        return max(int(lp.get("t_wall_ns") or 0), int(v.proc.progress_wall_ns or 0))
    for r in reversed(history(v.proc)):  # only for a rank whose last act failed (few)
        if r.get("kind") in PROGRESS_KINDS and r.get("state") != "failed":
            return int(r.get("t_wall_ns") or 0)
    return 0


def _stop_like(cause: str, text: str) -> bool:
    t = text.lower()
    return cause in STOP_CAUSES or (
        cause == Cause.EXCEPTION.value and (is_transport_raise(text) or "timeout" in t)
    )


def _candidates(ctx: Ctx) -> List[Tuple[actors.Failure, int]]:
    """Every rank-less actor failure with its slack (ns), by time (rules/actors.py)."""
    out: List[Tuple[actors.Failure, int]] = []
    for p in actors.rankless_actors(ctx):
        v = index_process(-1, p)
        fill_death(v)
        label = actors.actor_label(p)
        for t, method, err, _ in raised_phases(p):
            out.append(
                (
                    (t, label, Cause.EXCEPTION.value, "method %s raised %s" % (method, err[:300]), p.key),
                    ACT_SLACK_NS,
                )
            )
        if v.dead and not v.victim and not rankless_teardown(ctx, v):
            base = (v.mem or {}).get("base_cause") or v.cause
            slack = ACT_SLACK_KILLED_NS if base == Cause.KILLED_WITHOUT_RECORD.value else ACT_SLACK_NS
            out.append(((int(v.fail_wall or 0), label, str(v.cause), str(v.cause_text or ""), p.key), slack))
    return sorted(out, key=lambda f: (f[0][0] or 1 << 62, f[0][1]))


def find(ctx: Ctx) -> Optional[Finding]:
    """The earliest candidate (module docstring): ``start`` its failure time, ``data``
    (root failure, later actor failures, the ranks' newest progress ns); None without ranks
    or candidates."""
    if not ctx.views:
        return None
    progress = max(rank_progress_ns(v) for v in ctx.views.values())
    cands = _candidates(ctx)
    for i, ((t, _lab, cause, text, _key), slack) in enumerate(cands):
        if not t or progress > t + slack:
            continue  # a rank went on after it (or its time is unknown)
        window = STOPPED_WAIT_NS if _stop_like(cause, text) else int(ctx.stall_s * 1e9)
        if progress and t - progress >= window:
            continue  # after the ranks had stalled: stopping the job, or a consequence
        later = [f for j, (f, _s) in enumerate(cands) if j != i and (f[0] or 0) >= t]
        return Finding(NAME, (), t, data=(cands[i][0], later, progress))
    return None


def _rank_waits(ctx: Ctx) -> Dict[str, str]:
    """What each rank does while the job stands: in a collective, or a chain end's class."""
    out: Dict[str, str] = {}
    for r, inst in sorted(ctx.inst_of.items()):
        rec = ctx.views[r].blocked or {}
        out[str(r)] = "in %s seq %s on %s" % (desc_rec(rec), rec.get("seq"), ctx.gdesc(inst.group))
    if ctx.insts:
        ce = chain_ends(ctx)
        for e in ce.present:
            out.setdefault(str(e), ce.kinds[e][1])
    return out


def explain(ctx: Ctx, finding: Finding, d: Diagnosis) -> None:
    """The actor's failure as rule ``actors`` explains it (cause, ``culprit_actors``, Ray's
    text), then the ranks as its cascade: ``waiting_ranks``, ``details['rank_waits']``
    {str(rank): what it does}, their failures in ``cascade`` by time."""
    root, later, progress = finding.data
    actors.explain(ctx, Finding(actors.NAME, (), finding.start, data=("failed", root, later)), d)
    from hangtrace.tracer.analyze.failures.deaths import failures

    d.cascade = sorted(d.cascade + failures(ctx), key=lambda c: (c.get("wall_ns") or 0, c.get("rank", -1)))
    waits = _rank_waits(ctx)
    d.waiting_ranks = sorted(int(r) for r in waits)
    if waits:
        d.details["rank_waits"] = waits
    ctx.add(
        "no rank progressed after it: the ranks' newest progress was at %s, %.1f s %s the failure"
        % (ts(progress), abs(root[0] - progress) / 1e9, "before" if progress <= root[0] else "after")
    )
    for r, what in list(waits.items())[:6]:
        ctx.add("rank %s (cascade): %s" % (r, what))
    if waits:
        ctx.add(
            "%s %s afterwards: a cascade of Ray actor %s's failure, which no rank outlived at work"
            % (rk(d.waiting_ranks), vb(d.waiting_ranks), root[1])
        )


def ranks_wait_on_outside(hang: Any) -> bool:
    """True when every culprit of the hang finding ``hang`` is a chain end blocked outside
    collectives or dead (rule chain): the ranks could be waiting for something outside
    them - a Ray actor's output - not for each other."""
    kinds = getattr(hang, "end_kinds", None) or {}
    return bool(
        hang is not None
        and hang.rule == "chain"
        and hang.culprits
        and all(kinds.get(c) in ("stuck-outside-collective", "dead-rank") for c in hang.culprits)
    )
