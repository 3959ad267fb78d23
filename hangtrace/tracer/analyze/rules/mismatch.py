"""Rule *mismatch* -> 'collective-mismatch', cause 'mismatch' (first: it is definitive).

In an instance, the ranks at the same seq are compared on (op, dtype, numel, root/peer);
numel/dtype are not compared for ops whose sizes legitimately differ per rank (object
ops, all_to_all, gather/scatter). Two or more signatures -> mismatch; the culprits are
the ranks outside the largest signature class, or every rank when the largest classes
tie ("name all"). P2P: both sides posted the pair seq in the same direction
(send/send, recv/recv) or with different sizes -> mismatch on both ranks. Of several
mismatched instances the one with the most waiters (then the earliest) is shown.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from hangtrace.tracer.analyze.context import Ctx, Record
from hangtrace.tracer.analyze.evidence import desc_rec, fill_common, rk, where_rec
from hangtrace.tracer.analyze.rules.base import Finding
from hangtrace.tracer.analyze.stacktree import format_ranks
from hangtrace.tracer.analyze.waitgraph import Inst, Sig, inst_text
from hangtrace.tracer.diagnosis import Cause, Diagnosis, Kind

NAME = "mismatch"


def find(ctx: Ctx) -> Optional[Finding]:
    """The main mismatched instance (``data``: (main, others)), or None."""
    mism = [i for i in ctx.insts.values() if i.mismatch]
    if not mism:
        return None
    main = max(mism, key=lambda i: (len(i.waiters), -(i.start or 0)))
    return Finding(NAME, (), main.start, data=(main, [i for i in mism if i is not main]))


def _culprits(sigs: Dict[Sig, List[int]]) -> Tuple[List[int], Optional[str]]:
    sizes = sorted(((len(rs), k) for k, rs in sigs.items()), key=lambda x: -x[0])
    top = sizes[0][0]
    tied = [k for n, k in sizes if n == top]
    if len(tied) > 1:
        return ([r for rs in sigs.values() for r in rs],
                "no majority: %d signatures with %d rank(s) each; naming all" % (len(tied), top))
    culprits = [r for k, rs in sigs.items() if k != tied[0] for r in rs]
    return culprits or [r for rs in sigs.values() for r in rs], None


def _rec_at(ctx: Ctx, inst: Inst, r: int) -> Optional[Record]:
    """The record rank ``r`` posted at the instance."""
    v = ctx.views[r]
    if r in inst.waiters:
        return v.blocked
    if inst.p2p:
        return v.p2p.get((inst.group, inst.waiters[0]))
    return v.last.get(inst.group)


def explain(ctx: Ctx, finding: Finding, d: Diagnosis) -> None:
    """Signatures per rank class, the minority marked; ``details['signatures']``."""
    inst, others = finding.data
    sigs: Dict[Sig, List[int]] = inst.mismatch
    culprits, tie_note = _culprits(sigs)
    d.kind = Kind.COLLECTIVE_MISMATCH
    fill_common(ctx, d, culprits, inst)
    d.op = (_rec_at(ctx, inst, d.culprit_ranks[0]) or {}).get("op") or d.op
    d.cause = Cause.MISMATCH
    where: Dict[Sig, Tuple[Any, Any]] = {}
    for k, rs in sorted(sigs.items(), key=lambda kv: -len(kv[1])):
        rec = _rec_at(ctx, inst, rs[0]) or {}
        where[k] = (rec.get("phase"), rec.get("step"))
        ctx.add("%s at %s: %s (%s)%s%s" % (rk(rs, 8), inst_text(ctx, inst), desc_rec(rec),
                                           rec.get("state"), " in " + where_rec(rec) if where_rec(rec) else "",
                                           " [minority]" if set(rs) & set(culprits) and not tie_note else ""))
    if tie_note:
        ctx.add(tie_note)
    if inst.behind or inst.nofile:
        ctx.add("also not at this seq: behind %s; no file %s" % (format_ranks(inst.behind, 8),
                                                                  format_ranks(inst.nofile, 8)))
    d.details["signatures"] = [{"op": k[0], "dtype": k[1], "numel": k[2], "peer": k[3],
                                "ranks": sorted(rs), "phase": where.get(k, (None, None))[0],
                                "step": where.get(k, (None, None))[1]} for k, rs in sigs.items()]
    for i in others[:5]:
        ctx.add("another mismatch: %s (ranks %s)" % (inst_text(ctx, i), format_ranks(
            [r for rs in (i.mismatch or {}).values() for r in rs], 8)))
