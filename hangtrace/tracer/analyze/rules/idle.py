"""Rule *idle* -> 'progressing', or 'unknown' with cause 'stalled-inside-collective' /
'stalled-outside-collectives' (the fallback: always finds).

Everybody at the frontier: if waiting ranks exist but every instance has all its
members (a collective in progress), the run is 'progressing' when the last progress
anywhere is younger than ``stall_s`` (default 300 s) and the snapshot reason is not
'stall'; otherwise 'unknown' (a transport-level or in-kernel stall). No rank waiting at
all -> 'progressing' (or 'unknown' if stalled: nobody is in a collective; cause
'stalled-in-rendezvous' when no group was ever created and every rank with a stack is
inside ``init_process_group``, :func:`in_rendezvous`).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Dict, List, Optional, Tuple

from hangtrace.tracer.analyze.stuck.blocking import in_rendezvous_stack
from hangtrace.tracer.analyze.context import Ctx
from hangtrace.tracer.analyze.actors.actorgraph import label
from hangtrace.tracer.analyze.evidence import fill_common, stall_note
from hangtrace.tracer.analyze.stuck.importing import importing, importing_line
from hangtrace.tracer.analyze.rules.base import Finding
from hangtrace.tracer.analyze.stuck.stacktree import format_ranks
from hangtrace.tracer.analyze.graph.waitgraph import inst_text
from hangtrace.tracer.diagnosis import Cause, Diagnosis, Kind

NAME = "idle"


#: the variables a rank's env:// rendezvous reads (torch/distributed/rendezvous.py)
RENDEZVOUS_VARS = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE")


def join_requests(ctx: Ctx, ranks: List[int]) -> Dict[int, Dict[str, Any]]:
    """``{rank: its newest 'join' event}``: what its ``init_process_group`` call asked for
    (rank, world_size, master = the store's address, env_world_size), recorded before the
    rendezvous by the torch.distributed hooks; ranks without one are left out."""
    out: Dict[int, Dict[str, Any]] = {}
    for r in ranks:
        v = ctx.views.get(r)
        for e in (v.proc.events or ()) if v is not None else ():
            if isinstance(e, dict) and e.get("event") == "join":
                out[r] = e
    return out


def _odd(vals: Dict[int, Any]) -> Optional[Tuple[List[int], Any, str]]:
    """``(odd ranks, reference value, whose)`` when ``vals`` disagree: against rank 0's value
    (rank 0 hosts the store of an env:// or tcp:// rendezvous), else the majority's; None
    when they agree or tie without rank 0."""
    if len(set(vals.values())) < 2:
        return None
    if 0 in vals:
        ref, whose = vals[0], "rank 0 (it hosts the store)"
    else:
        counts = Counter(vals.values()).most_common(2)
        if counts[0][1] == counts[1][1]:
            return None
        ref, whose = counts[0][0], "the other ranks"
    return [r for r, v in vals.items() if v != ref], ref, whose


def _differ(
    by_rank: Dict[int, Dict[str, Any]],
    keys: Tuple[Tuple[str, str], ...],
    line: str,
    culprits: Dict[int, None],
    lines: List[str],
) -> None:
    """For each ``(key, label)``: the ranks of ``by_rank`` whose value differs (:func:`_odd`)
    become culprits, with one evidence line from format ``line`` (label, value(s), ranks,
    reference, whose)."""
    for key, what in keys:
        got = _odd({r: e.get(key) for r, e in sorted(by_rank.items())})
        if got is not None:
            odd, ref, whose = got
            culprits.update(dict.fromkeys(odd))
            lines.append(
                line
                % {
                    "label": what,
                    "vals": "/".join(sorted({str(by_rank[r].get(key)) for r in odd})),
                    "s": "s" if len(odd) > 1 else "",
                    "ranks": format_ranks(odd, 8),
                    "ref": ref,
                    "whose": whose,
                }
            )


def rendezvous_outliers(ctx: Ctx, ranks: List[int]) -> Tuple[List[int], List[str]]:
    """``(culprit ranks, evidence lines)`` of the ranks stuck in the rendezvous. First: a
    rank that several processes asked for at the same time (the process model's conflict).
    Else from what their ``init_process_group`` calls asked for (:func:`join_requests`): the
    ranks whose store address or world size differ from rank 0's (else the majority's);
    with one world size W for all, more than the ranks there are: the missing ranks when
    WORLD_SIZE says W too, else every rank (its call asks for W, WORLD_SIZE says otherwise).
    Without any request (rings of an older version, a call our hook did not see): their
    environment records' MASTER_ADDR / MASTER_PORT / WORLD_SIZE (``ctx.envs``), compared the
    same way. ([], []) without any of these."""
    dup = [
        (r, list(others) + [kept]) for r, kind, kept, others in ctx.dups if kind == "conflict" and r in ranks
    ]
    if dup:  # one RANK given to several processes: the rank it was meant for never comes
        missing = [r for r in range(ctx.world) if r not in ctx.views]
        return sorted(r for r, _ in dup), [
            "init_process_group was called as rank %d by %d processes at the same "
            "time (%s)%s: the launcher gives one RANK twice"
            % (
                r,
                len(keys),
                ", ".join(keys),
                "; no process is rank %s" % format_ranks(missing, 8) if missing else "",
            )
            for r, keys in dup
        ]
    culprits: Dict[int, None] = {}
    lines: List[str] = []
    reqs = join_requests(ctx, ranks)
    if not reqs:
        env = {pe.rank: dict(pe.environ) for pe in ctx.envs if pe.rank in ranks}
        _differ(
            env,
            tuple((v, v) for v in RENDEZVOUS_VARS),
            "the rendezvous variables differ: %(label)s=%(vals)s on rank%(s)s %(ranks)s, %(ref)s on %(whose)s",
            culprits,
            lines,
        )
        return sorted(culprits), lines
    _differ(
        reqs,
        (("master", "the store at"), ("world_size", "world size")),
        "init_process_group on rank%(s)s %(ranks)s asks for %(label)s %(vals)s; %(ref)s on %(whose)s",
        culprits,
        lines,
    )
    sizes = {e.get("world_size") for e in reqs.values()}
    w = next(iter(sizes)) if len(sizes) == 1 else None
    if lines or not isinstance(w, int):
        return sorted(culprits), lines
    missing = [r for r in range(w) if r not in ctx.views]
    if missing and len(missing) < w:
        env_w = {
            int(x) for x in (e.get("env_world_size") for e in reqs.values()) if isinstance(x, int) and x > 0
        }
        asked = format_ranks(sorted(reqs), 8)
        if env_w and env_w != {w}:
            culprits.update(dict.fromkeys(sorted(reqs)))
            lines.append(
                "init_process_group on ranks %s asks for world size %d, but WORLD_SIZE=%s in their "
                "environment and no process is rank %s: the rendezvous waits for ranks that will never "
                "come" % (asked, w, "/".join(str(x) for x in sorted(env_w)), format_ranks(missing, 8))
            )
        else:
            culprits.update(dict.fromkeys(missing))
            lines.append(
                "init_process_group on ranks %s asks for world size %d; no traced process is rank %s "
                "(not started, not traced, or started with another MASTER_ADDR/MASTER_PORT)"
                % (asked, w, format_ranks(missing, 8))
            )
    return sorted(culprits), lines


def in_rendezvous(ctx: Ctx) -> List[int]:
    """Ranks inside the rendezvous when that is all there is: no rank recorded a group or a
    collective, and every rank with a stack has a thread in a :data:`blocking.RENDEZVOUS_FUNCS`
    frame of torch.distributed; else []."""
    ranks = []
    for r, v in sorted(ctx.views.items()):
        if v.last or v.p2p or v.proc.groups:
            return []
        if not v.proc.stacks:
            continue
        if not in_rendezvous_stack(v.proc):
            return []
        ranks.append(r)
    return ranks


def find(ctx: Ctx) -> Optional[Finding]:
    """Always a Finding (``data``: the busiest instance or None)."""
    busy = sorted(ctx.insts.values(), key=lambda i: -len(i.waiters))[0] if ctx.insts else None
    return Finding(NAME, data=busy)


def explain(ctx: Ctx, finding: Finding, d: Diagnosis) -> None:
    """Progressing or stalled, inside or outside collectives; the stall note."""
    busy = finding.data
    note = stall_note(ctx)
    if busy is not None and not ctx.stalled:
        d.kind = Kind.PROGRESSING
        d.cause = None
        ctx.add(
            "every waiting rank is in a collective all its members entered (e.g. %s, ranks %s)"
            % (inst_text(ctx, busy), format_ranks(busy.waiters, 8))
        )
    elif busy is not None:
        d.kind = Kind.UNKNOWN
        d.cause = Cause.STALLED_INSIDE_COLLECTIVE
        fill_common(ctx, d, [], busy)
        ctx.add(
            "all members of %s entered it (ranks %s) and it does not complete: a transport or "
            "in-kernel stall; take native stacks (py-spy --native) of these ranks"
            % (inst_text(ctx, busy), format_ranks(busy.waiters, 8))
        )
    elif not ctx.stalled:
        d.kind = Kind.PROGRESSING
        ctx.add("no rank is blocked in a collective or p2p op")
    elif rdzv := in_rendezvous(ctx):
        d.kind = Kind.UNKNOWN
        d.cause = Cause.STALLED_IN_RENDEZVOUS
        d.details["rendezvous_ranks"] = rdzv
        ctx.add(
            "no process group was ever created: ranks %s are inside init_process_group (the "
            "rendezvous), waiting for the store at MASTER_ADDR:MASTER_PORT or for the other members "
            "of WORLD_SIZE" % format_ranks(rdzv, 8)
        )
        culprits, lines = rendezvous_outliers(ctx, rdzv)
        d.culprit_ranks = culprits
        for line in lines:
            ctx.add(line)
        ranked = {v.proc.key for v in ctx.views.values()}
        starting = [p for p in ctx.snap.processes if p.key not in ranked and p.key not in ctx.roles.helper_of]
        imp = importing(starting)
        if imp:  # ranks not yet joined, still importing (Ray actors import torch in their first method)
            who = [
                label(p, ctx.roles) + (" (phase '%s')" % p.phase if p.phase else "")
                for p in starting
                if p.key in imp
            ]
            ctx.add(
                importing_line(
                    "%d traced process(es) without a rank yet, maybe the ranks the rendezvous "
                    "waits for: %s," % (len(who), ", ".join(who[:4])),
                    list(imp.values()),
                )
            )
    else:
        d.kind = Kind.UNKNOWN
        d.cause = Cause.STALLED_OUTSIDE_COLLECTIVES
        imp = importing([v.proc for v in ctx.views.values()])
        ranks_imp = sorted(r for r, v in ctx.views.items() if v.proc.key in imp)
        if ranks_imp:
            ctx.add("no rank is in a collective, yet nothing progressed; see the stack classes")
            ctx.add(
                importing_line(
                    "rank%s %s" % ("s" if len(ranks_imp) > 1 else "", format_ranks(ranks_imp, 8)),
                    [imp[ctx.views[r].proc.key] for r in ranks_imp],
                )
            )
        else:
            gone = sorted(r for r, v in ctx.views.items() if v.proc.state == "exited" and not v.dead)
            ctx.add(
                "no rank is in a collective, yet nothing progressed: every %srank waits outside collectives; "
                "see the stack classes%s"
                % (
                    "alive " if gone else "",
                    "; ranks %s exited cleanly" % format_ranks(gone, 8) if gone else "",
                )
            )
        for c in [c for c in d.stack_classes if c.get("outlier")][:3]:
            ctx.add(
                "outlier stack (ranks %s): %s" % (format_ranks(c["ranks"], 8), " > ".join(c["frames"][-3:]))
            )
    if note:
        ctx.add(note)
