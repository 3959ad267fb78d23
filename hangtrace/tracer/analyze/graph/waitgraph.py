"""The wait-for graph: instances ranks are blocked in, their missing members, cycles.

An *instance* is one collective ``(group, seq)`` some rank is blocked in, or one p2p op
``(group, seq, waiter, peer)``. A member of the instance's group is *missing* when it
has no process, its highest seq in the group is lower (*behind*; includes "no record of
the group in its ring"), or it is dead. Members whose highest seq is higher are *ahead*
(they passed it: sequence numbers diverged); members at the same seq have posted it
(*at*), and their signatures ``(op, dtype, numel, root/peer)`` are compared: two or more
signatures make a *mismatch*. For p2p the peer is missing when its highest seq with the
waiter is lower; both sides posting the pair seq in the same direction, or with
different sizes, is a mismatch. Edges: rank -> instance it is blocked in -> missing
ranks. The graph is linear in ranks + group sizes (never ranks x ranks); cycles are
Tarjan's strongly connected components.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Hashable, Iterable, List, Mapping, Optional, Sequence, Tuple

from hangtrace.tracer.analyze.context import Ctx
from hangtrace.tracer.analyze.rankview import Record

_SEND = {
    "send": "send",
    "isend": "send",
    "recv": "recv",
    "irecv": "recv",
    "send_object_list": "send",
    "recv_object_list": "recv",
}
# ops whose dtype/numel legitimately differ between ranks
_VARSIZE_OPS = frozenset(
    (
        "all_gather_object",
        "gather_object",
        "broadcast_object_list",
        "scatter_object_list",
        "all_to_all",
        "all_to_all_single",
        "gather",
        "scatter",
        "batch_isend_irecv",
    )
)
_ROOTED_OPS = frozenset(
    (
        "broadcast",
        "reduce",
        "gather",
        "scatter",
        "broadcast_object_list",
        "gather_object",
        "scatter_object_list",
    )
)

Sig = Tuple[Any, ...]
Node = Tuple[Any, ...]


@dataclass(eq=False)
class Inst:
    """One instance some rank is blocked in (see the module docstring). ``start``: the
    earliest wait start of its waiters (ns since the epoch, 0 unknown); ``mismatch``:
    signature -> ranks, when two or more signatures were posted."""

    key: Tuple[Any, ...]
    group: Any
    seq: int
    waiters: List[int] = field(default_factory=list)
    missing: List[int] = field(default_factory=list)
    behind: List[int] = field(default_factory=list)
    nofile: List[int] = field(default_factory=list)
    deadm: List[int] = field(default_factory=list)
    ahead: List[int] = field(default_factory=list)
    at: List[int] = field(default_factory=list)
    p2p: bool = False
    peer: Any = None
    mismatch: Optional[Dict[Sig, List[int]]] = None
    start: int = 0


def signature(rec: Record) -> Sig:
    """What must agree between ranks at one seq: (op, dtype, numel, root/peer); sizes are
    not compared for ops whose sizes legitimately differ per rank."""
    op = rec.get("op")
    if op in _VARSIZE_OPS or rec.get("dtype") == "object":
        return (op, None, None, rec.get("peer") if op in _ROOTED_OPS else None)
    return (op, rec.get("dtype"), rec.get("numel"), rec.get("peer") if op in _ROOTED_OPS else None)


def build_instances(ctx: Ctx) -> Tuple[Dict[Any, Inst], Dict[int, Inst]]:
    """Instances ranks are blocked in (key -> Inst) and each waiting rank's instance."""
    insts: Dict[Any, Inst] = {}
    inst_of: Dict[int, Inst] = {}
    for r, v in ctx.views.items():
        b = v.blocked
        if b is None or (v.dead and not v.victim):
            continue  # a dead rank waits for nobody: others wait for it
        g, s = b.get("group"), b.get("seq") or 0
        if b.get("kind") == "p2p":
            key: Tuple[Any, ...] = ("p", g, s, r, b.get("peer"))
            inst = insts[key] = Inst(key, g, s, p2p=True, peer=b.get("peer"))
        else:
            key = ("c", g, s)
            found = insts.get(key)
            inst = found if found is not None else insts.setdefault(key, Inst(key, g, s))
        inst.waiters.append(r)
        t = b.get("t_wall_ns") or 0
        if t and (not inst.start or t < inst.start):
            inst.start = t
        inst_of[r] = inst
    for inst in insts.values():
        if inst.p2p:
            _fill_p2p(ctx, inst)
        else:
            _fill_coll(ctx, inst)
    return insts, inst_of


def _fill_coll(ctx: Ctx, inst: Inst) -> None:
    g, s = inst.group, inst.seq
    views = ctx.views
    waiting = set(inst.waiters)
    sigs: Dict[Sig, List[int]] = {}
    for m in ctx.members(g) or inst.waiters:
        v = views.get(m)
        if v is None:
            inst.nofile.append(m)
            continue
        if m in waiting:
            rec = ctx.blocked(m)
        else:
            last = v.last.get(g)
            if last is None or (last.get("seq") or 0) < s:
                inst.behind.append(m)
                continue
            if (last.get("seq") or 0) > s:
                inst.ahead.append(m)
                continue
            rec = last
        inst.at.append(m)
        if v.dead and not v.victim:
            inst.deadm.append(m)
        sigs.setdefault(signature(rec), []).append(m)
    inst.missing = inst.behind + inst.nofile + inst.deadm
    if len(sigs) > 1:
        inst.mismatch = sigs


def _fill_p2p(ctx: Ctx, inst: Inst) -> None:
    g, s = inst.group, inst.seq
    w = inst.waiters[0]
    peer = inst.peer
    v = ctx.views.get(peer)
    if v is None:
        inst.nofile.append(peer)
    else:
        rec = v.p2p.get((g, w))
        if rec is None or (rec.get("seq") or 0) < s:
            inst.behind.append(peer)
        elif (rec.get("seq") or 0) > s:
            inst.ahead.append(peer)
        else:
            inst.at.append(peer)
            mine = ctx.blocked(w)
            d1, d2 = _SEND.get(str(mine.get("op"))), _SEND.get(str(rec.get("op")))
            bad = (d1 and d2 and d1 == d2) or (
                mine.get("numel") != rec.get("numel") or mine.get("dtype") != rec.get("dtype")
            )
            if (
                bad
                and peer != w
                and mine.get("op") != "batch_isend_irecv"
                and rec.get("op") != "batch_isend_irecv"
            ):
                # one side each (keys differ by rank even when both sides sent)
                inst.mismatch = {signature(mine) + (d1, w): [w], signature(rec) + (d2, peer): [peer]}
            if v.dead and not v.victim:
                inst.deadm.append(peer)
    inst.missing = inst.behind + inst.nofile + inst.deadm


def tarjan(adj: Mapping[Node, Sequence[Node]], starts: Iterable[Node]) -> List[List[Node]]:
    """Strongly connected components (size > 1) reachable from ``starts``; iterative."""
    index: Dict[Hashable, int] = {}
    low: Dict[Hashable, int] = {}
    onstack = set()
    stack: List[Node] = []
    out: List[List[Node]] = []
    counter = 0
    for s in starts:
        if s in index:
            continue
        work = [(s, iter(adj.get(s, ())))]
        index[s] = low[s] = counter
        counter += 1
        stack.append(s)
        onstack.add(s)
        while work:
            node, it = work[-1]
            advanced = False
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    onstack.add(nxt)
                    work.append((nxt, iter(adj.get(nxt, ()))))
                    advanced = True
                    break
                elif nxt in onstack:
                    if index[nxt] < low[node]:
                        low[node] = index[nxt]
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                if low[node] < low[parent]:
                    low[parent] = low[node]
            if low[node] == index[node]:
                comp: List[Node] = []
                while True:
                    x = stack.pop()
                    onstack.discard(x)
                    comp.append(x)
                    if x == node:
                        break
                if len(comp) > 1:
                    out.append(comp)
    return out


@dataclass(frozen=True)
class Cycles:
    """The cycles of the wait-for graph: every SCC, and the largest one's ranks and
    instances (empty when there is none)."""

    sccs: Tuple[Tuple[Node, ...], ...]
    ranks: Tuple[int, ...]
    insts: Tuple[Inst, ...]


def cycles(ctx: Ctx) -> Cycles:
    """Cycles of ``ctx``'s wait-for graph (memoised in ``ctx.cache``)."""
    got = ctx.cache.get("cycles")
    if isinstance(got, Cycles):
        return got
    adj: Dict[Node, Sequence[Node]] = {}
    for r, inst in ctx.inst_of.items():
        adj[("r", r)] = (inst.key,)
    for inst in ctx.insts.values():
        if inst.missing:
            adj[inst.key] = [("r", m) for m in inst.missing]
    sccs = tarjan(adj, [("r", r) for r in sorted(ctx.inst_of)])
    if sccs:
        comp = max(sccs, key=len)
        out = Cycles(
            tuple(tuple(c) for c in sccs),
            tuple(sorted(n[1] for n in comp if n[0] == "r")),
            tuple(ctx.insts[n] for n in comp if n[0] != "r"),
        )
    else:
        out = Cycles((), (), ())
    ctx.cache["cycles"] = out
    return out


def inst_text(ctx: Ctx, inst: Inst) -> str:
    """ "group 'g' seq 7" / "p2p on group 'g' pair seq 3 with rank 1"."""
    if inst.p2p:
        w = inst.waiters[0] if inst.waiters else "?"
        return "p2p on %s pair seq %s between ranks %s and %s" % (
            ctx.gdesc(inst.group),
            inst.seq,
            w,
            inst.peer,
        )
    return "%s seq %s" % (ctx.gdesc(inst.group), inst.seq)


def chain(ctx: Ctx, culprit: int) -> List[Tuple[int, Optional[Inst]]]:
    """Longest wait chain ending at ``culprit``: [(rank, inst or None), ...]."""
    # reverse BFS: culprit <- instances that miss it <- their waiters <- ...
    rev: Dict[int, List[Inst]] = {}
    for inst in ctx.insts.values():
        for m in inst.missing:
            rev.setdefault(m, []).append(inst)
    parent: Dict[int, Optional[int]] = {culprit: None}
    frontier = [culprit]
    last = culprit
    steps = 0
    while frontier and steps < 64:
        nxt: List[int] = []
        for m in frontier:
            for inst in rev.get(m, ()):
                for w in inst.waiters:
                    if w not in parent:
                        parent[w] = m
                        nxt.append(w)
        if nxt:
            last = min(nxt)
        frontier = nxt
        steps += 1
    out: List[Tuple[int, Optional[Inst]]] = []
    r: Optional[int] = last
    while r is not None:
        out.append((r, ctx.inst_of.get(r)))
        r = parent[r]
    return out


def chain_text(ctx: Ctx, ch: List[Tuple[int, Optional[Inst]]]) -> str:
    """ "wait chain: rank 0 waits in ... -> rank 3 (not in a collective)"."""
    parts = []
    for r, inst in ch:
        if inst is None:
            parts.append(
                "rank %d (not in a collective)" % r if r in ctx.views else "rank %d (no record file)" % r
            )
        else:
            parts.append("rank %d waits in %s %s" % (r, inst_text(ctx, inst), ctx.blocked(r).get("op")))
    return "wait chain: " + " -> ".join(parts)
