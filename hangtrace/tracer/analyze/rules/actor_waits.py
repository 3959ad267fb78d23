"""Rule *actor_waits* -> ``actor-deadlock``, or the actor a chain of actor calls ends at
(issue 9): the wait-for graph across Ray actor calls (``analyze/actors/actorgraph.py``, from the
``K_WAIT`` records of ``hooks/rayhooks/ray_calls.py``: which process is inside ``ray.get`` /
``ray.wait`` on which actor's method).

Used for snapshots without ranks (after rule ``actors`` found no failure), when the job
made no progress for the stall threshold:

* a **cycle** of open waits (A waits on B's method, B on C's, ..., back to A; or an actor
  on its own method) -> kind ``actor-deadlock`` (cause None), ``culprit_actors`` = the
  cycle's actors, ``details['actor_cycle']`` one item per member (its method, the call it
  is blocked in, the method it waits on and whether that method started since the
  waiting method call began: ``Wait.called``), the
  processes waiting into the cycle (the driver) in ``details['actor_waiters']``;
* no cycle, but a **chain** of waits that ends at a live actor waiting on no one -> that
  actor is the culprit: ``stuck-outside-collective`` (cause ``blocked`` while it is inside
  a method, ``no-progress`` when it is not), ``details['actor_chain']`` the waiters.
  A chain that ends at an actor without a process is left to rule ``unschedulable``.
* a chain that ends at an actor **inside no method** whose awaited methods never started
  since the waits began -> no culprit: kind ``unknown`` (cause
  ``stalled-outside-collectives``), ``details['actor_chain_incomplete']`` (the idle actor,
  the methods): an idle actor cannot hold anyone, so a wait that holds the chain was not
  recorded (a call queued behind something unseen); naming it would be a guess.

Otherwise the rule does not find. Limits: the waits seen are those of ``hooks/ray_calls``
(``ray.get``/``ray.wait``/``await`` on refs the same process made); a ``ray.wait`` for any
one of several refs counts as a wait on each of them; a node is a process, so a cycle
through an async actor is judged by its open waits, each of the method call that made it.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from hangtrace.tracer.analyze.actors import actorgraph as G
from hangtrace.tracer.analyze.stuck.blocking import blocking_reason
from hangtrace.tracer.analyze.context import Ctx
from hangtrace.tracer.analyze.stuck.stacktree import process_frames
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
        return Finding(
            NAME, (), min(w.since_wall_ns for k in first for w in g.waits[k]), data=("cycle", first, g)
        )
    ends = {
        k: v
        for k, v in G.chain_ends(g).items()
        if g.procs[k].state in G.LIVE_STATES and (g.procs[k].meta or {}).get("ray_actor_id")
    }
    if ends:
        end = max(ends, key=lambda k: (len(ends[k]), k))
        return Finding(
            NAME,
            (),
            min(w.since_wall_ns for k in ends[end] for w in g.waits[k]),
            data=("incomplete" if unstarted(g, end) else "chain", end, ends[end], g),
        )
    return None


def unstarted(g: G.ActorGraph, end: str) -> List[Tuple[G.Wait, G.Target]]:
    """The waits on actor ``end`` when it is inside no method and none of the methods they
    wait on started since the wait began: the edge that holds the chain is not recorded
    (the call is queued behind something unseen, or lost); else []."""
    p = g.procs[end]
    if p.phase:
        return []
    into = [(w, t) for k in g.waits for d, w, t in g.edges.get(k, ()) if d == end]
    if into and all(G.started_since(p, t.method, w.called()) is False for w, t in into):
        return into
    return []


def _member(ctx: Ctx, g: G.ActorGraph, key: str, nxt: str, asked: Optional[str] = None) -> Dict[str, Any]:
    """Cycle member ``key`` waiting on ``nxt``: by the wait its call of ``asked`` (the
    method the member before it waits on) made, when there is one."""
    p = g.procs[key]
    e = G.edge(g, key, nxt, asked)
    item: Dict[str, Any] = {
        "actor": G.label(p, g.roles),
        "process": key,
        "method": None,
        "api": None,
        "waits_on": G.label(g.procs[nxt], g.roles),
        "target_method": None,
        "since_wall_ns": None,
        "target_started": None,
        "target_inside": g.procs[nxt].phase,
    }
    if e is not None:
        w, t = e
        item.update(
            method=w.method,
            api=w.api,
            target_method=t.method,
            since_wall_ns=w.since_wall_ns,
            target_started=G.started_since(g.procs[nxt], t.method, w.called()),
        )
        site = G.wait_site(p, w.method)
        if site is not None:  # the line of the wait, and whether it blocks the actor's event loop
            item.update(
                at=site["at"], code=site["code"], blocks_loop=site["blocks_loop"] and w.api != "await"
            )
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
                out.append(
                    {
                        "actor": who,
                        "process": key,
                        "method": w.method,
                        "api": w.api,
                        "waits_on": whom,
                        "target_method": t.method,
                        "since_wall_ns": w.since_wall_ns,
                    }
                )
                ctx.add(
                    "%s (%s)%s waits (%s since %s) on %s.%s"
                    % (
                        who,
                        key,
                        " in %s" % w.method if w.method else "",
                        G.call_text(w.api),
                        ts(w.since_wall_ns),
                        whom,
                        t.method,
                    )
                )
                break
    named = inside | {x["process"] for x in out}
    for key in sorted(
        g.procs
    ):  # blocked in ray.get on an object passed to it: the stack says so, no wait record
        p = g.procs[key]
        if (
            key in named
            or not p.phase
            or p.state not in G.LIVE_STATES
            or not (p.meta or {}).get("ray_actor_id")
        ):
            continue
        site = G.wait_site(p, p.phase)
        frames, thread = process_frames(p)
        why = blocking_reason(frames, thread=thread) if frames else None
        if site is None or not why or not why.startswith("ray.get/ray.wait"):
            continue
        who = G.label(p, g.roles)
        out.append(
            {
                "actor": who,
                "process": key,
                "method": p.phase,
                "api": "get",
                "waits_on": None,
                "target_method": None,
                "since_wall_ns": None,
                "at": site["at"],
                "code": site["code"],
            }
        )
        ctx.add(
            "%s (%s) in %s is blocked in ray.get/ray.wait at %s on an object it did not create (no wait "
            "record to follow)" % (who, key, p.phase, site["at"])
        )
    return out


def explain(ctx: Ctx, finding: Finding, d: Diagnosis) -> None:
    """Fill kind, ``culprit_actors``, ``details['actor_cycle' | 'actor_chain']`` and
    ``details['actor_waiters']``; an evidence line per wait."""
    what = finding.data[0]
    if what == "cycle":
        _, members, g = finding.data
        items: List[Dict[str, Any]] = []
        for i, k in enumerate(members):
            prev = G.edge(g, members[i - 1], k) if len(members) > 1 else None
            items.append(
                _member(ctx, g, k, members[(i + 1) % len(members)], prev[1].method if prev else None)
            )
        d.kind, d.cause = Kind.ACTOR_DEADLOCK, None
        d.culprit_actors = sorted({it["actor"] for it in items})
        d.phase = items[0]["method"]
        d.details["actor_cycle"] = items
        for it in items:
            started = {
                True: "that method started after the wait began",
                False: "that method has not started since (%s is inside %s)"
                % (it["waits_on"], it["target_inside"] or "no method"),
                None: "not known whether that method started",
            }[it["target_started"]]
            ctx.add(
                "Ray actor %s (%s)%s is blocked in %s since %s on %s.%s: %s%s%s"
                % (
                    it["actor"],
                    it["process"],
                    " in method %s" % it["method"] if it["method"] else "",
                    G.call_text(it["api"]),
                    ts(it["since_wall_ns"]) if it["since_wall_ns"] else "?",
                    it["waits_on"],
                    it["target_method"],
                    started,
                    "; at %s" % it["at"] if it.get("at") else "",
                    "; the call blocks the actor's asyncio event loop" if it.get("blocks_loop") else "",
                )
            )
        d.details["actor_waiters"] = _waiters_into(ctx, g, members)
        if finding.start:
            d.details["hang_start_wall_ns"] = finding.start
        return
    _, end, _waiters, g = finding.data
    p = g.procs[end]
    if what == "incomplete":
        _incomplete(ctx, finding, d, end, g)
        return
    d.kind = Kind.STUCK_OUTSIDE_COLLECTIVE
    d.cause = Cause.BLOCKED if p.phase else Cause.NO_PROGRESS
    d.culprit_actors = [G.label(p, g.roles)]
    d.phase = p.phase
    d.details["actor_methods"] = {G.label(p, g.roles): [p.phase] if p.phase else []}
    d.details["actor_chain"] = _chain(ctx, g, end)
    ctx.add(
        "Ray actor %s (%s) is at the end of a chain of waits on actor calls and waits on no actor: %s"
        % (G.label(p, g.roles), end, "inside method %s" % p.phase if p.phase else "inside no method")
    )
    d.details["culprit_process"] = p.key
    doing = G.doing(p)
    if doing:
        d.details["actor_doing"] = doing
        ctx.add("Ray actor %s: %s" % (G.label(p, g.roles), doing))
    if finding.start:
        d.details["hang_start_wall_ns"] = finding.start


def _chain(ctx: Ctx, g: G.ActorGraph, end: str) -> List[Dict[str, Any]]:
    """The waiters of a chain that ends at ``end``, nearest first."""
    chain: List[Dict[str, Any]] = []
    reached = [end]
    while True:  # nearest waiters first: those on the end, then those on them, ...
        more = [c for c in _waiters_into(ctx, g, reached) if c["process"] not in reached]
        if not more:
            break
        chain.extend(more)
        reached.extend(c["process"] for c in more)
    return chain


def _incomplete(ctx: Ctx, finding: Finding, d: Diagnosis, end: str, g: G.ActorGraph) -> None:
    """A chain ending at an idle actor whose awaited methods never started: no culprit
    (kind unknown), the chain and the idle actor in ``details['actor_chain_incomplete']``."""
    p = g.procs[end]
    d.kind, d.cause = Kind.UNKNOWN, Cause.STALLED_OUTSIDE_COLLECTIVES
    d.culprit_actors = []
    d.details["actor_chain"] = _chain(ctx, g, end)
    d.details["actor_chain_incomplete"] = {
        "actor": G.label(p, g.roles),
        "process": end,
        "methods": sorted({t.method for _, t in unstarted(g, end)}),
    }
    ctx.add(
        "Ray actor %s (%s) is waited on (%s) but inside no method, and none of those methods started since "
        "the waits began: a wait that holds the chain is not recorded; not naming it"
        % (G.label(p, g.roles), end, ", ".join(d.details["actor_chain_incomplete"]["methods"]))
    )
    if finding.start:
        d.details["hang_start_wall_ns"] = finding.start
