"""Rule *extra_collective* -> 'skipped-collective', cause 'extra-collective' (an apparent
cycle explained by one rank's extra collective; checked before *deadlock*).

For each collective instance of the largest cycle whose missing members are *behind*
(they never issued that seq): when the group belongs to a role (``roles.role_groups``,
e.g. the CP groups cp0, cp1) and a strict majority of the role's ranks issued the same
number N of collectives on their group of the role, while the waiter issued more and
the members it waits for issued exactly N, the waiter issued an extra collective the
others never issue (an extra micro-batch, an extra loop iteration): it is the culprit,
and the cycle only arises because its peers moved on to other groups. Example: CP
{0,1},{2,3}: rank 1 waits in an extra cp0 all_reduce, rank 0 went on into the world
all_reduce, rank 3 waits in dp1 for rank 1 - a cycle 0 -> 1 -> 0, but rank 1 issued N+1
on cp0 where ranks 0, 2, 3 issued N. A genuine cross-group deadlock (groups entered in
opposite orders) has no such majority: every rank issues the same number of
collectives per group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from hangtrace.tracer.analyze.context import Ctx
from hangtrace.tracer.analyze.evidence import fill_common, rank_line, rk
from hangtrace.tracer.analyze.graph.role_groups import role_counts, role_groups, role_stem
from hangtrace.tracer.analyze.rules.base import Finding
from hangtrace.tracer.analyze.stuck.stacktree import format_ranks
from hangtrace.tracer.analyze.graph.waitgraph import Inst, cycles, inst_text
from hangtrace.tracer.diagnosis import Cause, Diagnosis, Kind

NAME = "extra_collective"


@dataclass(frozen=True)
class Extra:
    """One instance explained by an extra collective: its waiters that issued more than
    the role's majority count ``base``; ``counts``: rank -> (group, count)."""

    inst: Inst
    waiters: Tuple[int, ...]
    role: Tuple[str, ...]
    counts: Dict[int, Tuple[str, int]]
    base: int


def _explained(ctx: Ctx, inst: Inst) -> Optional[Extra]:
    if inst.p2p or not inst.behind or inst.nofile or inst.deadm:
        return None
    role = role_groups(ctx, inst.group)
    if not role:
        return None
    counts = role_counts(ctx, role)
    if len(counts) < 3:
        return None
    freq: Dict[int, int] = {}
    for _h, n in counts.values():
        freq[n] = freq.get(n, 0) + 1
    base, nbase = max(freq.items(), key=lambda kv: (kv[1], -kv[0]))
    if nbase * 2 <= len(counts):
        return None
    waiters = [w for w in inst.waiters if counts.get(w, ("", 0))[1] > base]
    if not waiters or any(counts.get(b, ("", -1))[1] != base for b in inst.behind):
        return None
    return Extra(inst, tuple(waiters), tuple(role), counts, base)


def find(ctx: Ctx) -> Optional[Finding]:
    """The extra collective behind the largest cycle (``data``: (main Extra, all Extras,
    cycle ranks)), or None."""
    cyc = cycles(ctx)
    if not cyc.sccs:
        return None
    found = [e for e in (_explained(ctx, i) for i in cyc.insts) if e is not None]
    if not found:
        return None
    main = max(found, key=lambda f: (len(ctx.members(f.inst.group)), -(f.inst.start or 0)))
    culprits = sorted(set(w for f in found for w in f.waiters))
    return Finding(NAME, tuple(culprits), main.inst.start, data=(main, found, list(cyc.ranks)))


def explain(ctx: Ctx, finding: Finding, d: Diagnosis) -> None:
    """Counts per rank of the role, the peers' lines, the rest of the cycle as cascade;
    ``details['extra_collective']``, ``details['cycle']``."""
    main, found, cycle_ranks = finding.data
    inst, role, counts, base = main.inst, main.role, main.counts, main.base
    culprits: List[int] = list(finding.culprits)
    d.kind = Kind.SKIPPED_COLLECTIVE
    d.cause = Cause.EXTRA_COLLECTIVE
    fill_common(ctx, d, culprits, inst)
    op = ctx.blocked(inst.waiters[0]).get("op")
    d.op = op
    role_name = role_stem((ctx.groups.get(inst.group) or {}).get("desc")) or "same-role"
    peers = sorted(inst.behind)
    others = sorted(r for r, (h, _n) in counts.items() if h != inst.group)
    d.details["extra_collective"] = {
        "role": role_name,
        "groups": [
            {"name": h, "desc": (ctx.groups.get(h) or {}).get("desc"), "ranks": list(ctx.members(h))}
            for h in role
        ],
        "counts": {str(r): n for r, (_h, n) in sorted(counts.items())},
        "majority_count": base,
        "culprit_counts": {str(r): counts[r][1] for r in culprits},
        "peers": peers,
        "other_group_ranks": others,
        "op": op,
        "group_desc": ctx.gdesc(inst.group),
    }
    d.details["cycle"] = {
        "ranks": cycle_ranks,
        "groups": sorted({f.inst.group for f in found}),
        "explained_by": "extra-collective",
    }
    n_c = counts[culprits[0]][1]
    ctx.add(
        "%s issued %d collective(s) on %s, %d more than %s on the same group (%d) and than %s "
        "on the other %s group(s) (%d each): an extra %s the others never issue"
        % (
            rk(culprits, 8),
            n_c,
            ctx.gdesc(inst.group),
            n_c - base,
            rk(peers, 8),
            base,
            rk(others, 8) if others else "no rank",
            role_name,
            base,
            op,
        )
    )
    for b in peers[:3]:
        ctx.add(rank_line(ctx, b, inst.group))
    # the rest of the apparent cycle is cascade of the extra collective
    for r in sorted(ctx.inst_of):
        if r in culprits:
            continue
        i = ctx.inst_of[r]
        ctx.add(
            "rank %d waits in %s (%s) for %s (cascade)"
            % (
                r,
                inst_text(ctx, i),
                ctx.blocked(r).get("op"),
                format_ranks(i.missing, 8) if i.missing else "nobody",
            )
        )
    d.details["direct_waiters"] = sorted(r for r, i in ctx.inst_of.items() if set(i.missing) & set(culprits))
    d.details["culprit_kinds"] = {str(r): Kind.SKIPPED_COLLECTIVE.value for r in culprits}
    d.details["culprit_reasons"] = {
        str(r): "issued an extra %s on %s (%d vs %d on its peers and on the other %s groups)"
        % (op, ctx.gdesc(inst.group), counts[r][1], base, role_name)
        for r in culprits
    }
