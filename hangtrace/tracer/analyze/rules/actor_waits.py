"""Rule *actor_waits* -> ``actor-deadlock``, or the actor a chain of actor calls ends at
(issue 9): the wait-for graph across Ray actor calls (``analyze/actorgraph.py``, from the
``K_WAIT`` records of ``hooks/ray_calls.py``: which process is inside ``ray.get`` /
``ray.wait`` on which actor's method).

Used for snapshots without ranks (after rule ``actors`` found no failure), when the job
made no progress for the stall threshold:

* a **cycle** of open waits (A waits on B's method, B on C's, ..., back to A; or an actor
  on its own method) -> kind ``actor-deadlock`` (cause None), ``culprit_actors`` = the
  cycle's actors, ``details['actor_cycle']`` one item per member (its method, the call it
  is blocked in, the method it waits on and whether that method started since), the
  processes waiting into the cycle (the driver) in ``details['actor_waiters']``;
* no cycle, but a **chain** of waits that ends at a live actor waiting on no one -> that
  actor is the culprit: ``stuck-outside-collective`` (cause ``blocked`` while it is inside
  a method, ``no-progress`` when it is not), ``details['actor_chain']`` the waiters.
  A chain that ends at an actor without a process is left to rule ``unschedulable``.

Otherwise the rule does not find. Limits: the waits seen are those of ``hooks/ray_calls``
(``ray.get``/``ray.wait`` on refs the same process made; not ``await ref``); a
``ray.wait`` for any one of several refs counts as a wait on each of them.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from hangtrace.tracer.analyze import actorgraph as G
from hangtrace.tracer.analyze.context import Ctx
from hangtrace.tracer.analyze.evidence import ts
from hangtrace.tracer.analyze.rules.base import Finding
from hangtrace.tracer.diagnosis import Cause, Diagnosis, Kind

NAME = "actor_waits"


def stale(ctx: Ctx) -> bool:
    """The snapshot is a stall, or no traced process progressed for ``ctx.stall_s``."""
    if ctx.stalled:
        return True
    last = max((p.progress_wall_ns for p in ctx.snap.processes), default=0)
    return bool(last and ctx.now and (ctx.now - last) / 1e9 >= ctx.stall_s)


def graph(ctx: Ctx) -> G.ActorGraph:
    """The actor wait-for graph of the snapshot (built once per diagnose)."""
    g = ctx.cache.get("actorgraph")
    if g is None:
        g = ctx.cache["actorgraph"] = G.build(ctx.snap.processes)
    return g


def find(ctx: Ctx) -> Optional[Finding]:
    """``data``: ('cycle', [keys], graph) or ('chain', end key, [waiter keys], graph)."""
    if not stale(ctx):
        return None
    g = graph(ctx)
    if not g.waits:
        return None
    cyc = G.cycles(g)
    if cyc:
        first = min(cyc, key=lambda c: min(w.since_wall_ns for k in c for w in g.waits[k]))
        return Finding(NAME, (), min(w.since_wall_ns for k in first for w in g.waits[k]), data=("cycle", first, g))
    ends = {k: v for k, v in G.chain_ends(g).items() if g.procs[k].state in G.LIVE_STATES
            and (g.procs[k].meta or {}).get("ray_actor_id")}
    if ends:
        end = max(ends, key=lambda k: (len(ends[k]), k))
        return Finding(NAME, (), min(w.since_wall_ns for k in ends[end] for w in g.waits[k]),
                       data=("chain", end, ends[end], g))
    return None


def _member(ctx: Ctx, g: G.ActorGraph, key: str, nxt: str) -> Dict[str, Any]:
    p = g.procs[key]
    e = G.edge(g, key, nxt)
    item: Dict[str, Any] = {"actor": G.label(p, g.roles), "process": key, "method": None, "api": None,
                            "waits_on": G.label(g.procs[nxt], g.roles), "target_method": None,
                            "since_wall_ns": None, "target_started": None, "target_inside": g.procs[nxt].phase}
    if e is not None:
        w, t = e
        item.update(method=w.method, api=w.api, target_method=t.method, since_wall_ns=w.since_wall_ns,
                    target_started=G.started_since(g.procs[nxt], t.method, w.since_wall_ns))
    return item


def _waiters_into(ctx: Ctx, g: G.ActorGraph, members: List[str]) -> List[Dict[str, Any]]:
    """Processes outside ``members`` whose waits lead into them (the driver ...)."""
    out = []
    inside = set(members)
    for key in sorted(g.waits):
        if key in inside:
            continue
        for dst, w, t in g.edges.get(key, ()):
            if dst in inside:
                who, whom = G.label(g.procs[key], g.roles), G.label(g.procs[dst], g.roles)
                out.append({"actor": who, "process": key, "method": w.method, "api": w.api, "waits_on": whom,
                            "target_method": t.method, "since_wall_ns": w.since_wall_ns})
                ctx.add("%s (%s)%s waits (ray.%s since %s) on %s.%s" % (
                    who, key, " in %s" % w.method if w.method else "", w.api, ts(w.since_wall_ns), whom, t.method))
                break
    return out


def explain(ctx: Ctx, finding: Finding, d: Diagnosis) -> None:
    """Fill kind, ``culprit_actors``, ``details['actor_cycle' | 'actor_chain']`` and
    ``details['actor_waiters']``; an evidence line per wait."""
    what = finding.data[0]
    if what == "cycle":
        _, members, g = finding.data
        items = [_member(ctx, g, k, members[(i + 1) % len(members)]) for i, k in enumerate(members)]
        d.kind, d.cause = Kind.ACTOR_DEADLOCK, None
        d.culprit_actors = sorted({it["actor"] for it in items})
        d.phase = items[0]["method"]
        d.details["actor_cycle"] = items
        for it in items:
            started = {True: "that method started after the wait began",
                       False: "that method has not started since (%s is inside %s)" % (
                           it["waits_on"], it["target_inside"] or "no method"),
                       None: "not known whether that method started"}[it["target_started"]]
            ctx.add("Ray actor %s (%s)%s is blocked in ray.%s since %s on %s.%s: %s" % (
                it["actor"], it["process"], " in method %s" % it["method"] if it["method"] else "",
                it["api"], ts(it["since_wall_ns"]) if it["since_wall_ns"] else "?", it["waits_on"],
                it["target_method"], started))
        d.details["actor_waiters"] = _waiters_into(ctx, g, members)
        if finding.start:
            d.details["hang_start_wall_ns"] = finding.start
        return
    _, end, _waiters, g = finding.data
    p = g.procs[end]
    d.kind = Kind.STUCK_OUTSIDE_COLLECTIVE
    d.cause = Cause.BLOCKED if p.phase else Cause.NO_PROGRESS
    d.culprit_actors = [G.label(p, g.roles)]
    d.phase = p.phase
    d.details["actor_methods"] = {G.label(p, g.roles): [p.phase] if p.phase else []}
    chain: List[Dict[str, Any]] = []
    reached = [end]
    while True:  # nearest waiters first: those on the end, then those on them, ...
        more = [c for c in _waiters_into(ctx, g, reached) if c["process"] not in reached]
        if not more:
            break
        chain.extend(more)
        reached.extend(c["process"] for c in more)
    d.details["actor_chain"] = chain
    ctx.add("Ray actor %s (%s) is at the end of a chain of waits on actor calls and waits on no actor: %s" % (
        G.label(p, g.roles), end, "inside method %s" % p.phase if p.phase else "inside no method"))
    if finding.start:
        d.details["hang_start_wall_ns"] = finding.start
