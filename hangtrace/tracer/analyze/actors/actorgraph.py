"""The wait-for graph across Ray actor calls (issue 9), from the processes' own records.

A node is a traced process with a Ray identity (an actor, the driver, a task worker). An
edge ``A -> B`` says: a thread of A is inside ``ray.get`` / ``ray.wait`` on the result of
a call of B's method, or a method call of A (an asyncio task) awaits it (``K_WAIT`` ring
records of ``hooks/rayhooks/ray_calls.py``; newest per thread, every open await on its own,
``RingSummary.waits``). A wait belongs to the method call that waits (its record's phase),
not to the process's current phase: an async or threaded actor has several at once. A wait is *open* when its record is still 'issued', or ended by
a stop (``SystemExit`` / ``KeyboardInterrupt``: Ray's SIGTERM handler or ``ray.shutdown``
ended the process inside the wait). A target actor id without a process in the snapshot
is *absent* (never started, not traced, or on a node not collected).

Pure; linear in processes + open waits. Actor ids are hex strings; times ns since the epoch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from hangtrace.tracer.analyze.stuck.asynctasks import describe as describe_loop
from hangtrace.tracer.analyze.stuck.blocking import blocking_reason
from hangtrace.tracer.analyze.failures.causes import STOP_ERRORS
from hangtrace.tracer.stackmodel.usercode import user_code
from hangtrace.tracer.analyze.stuck.stacktree import (
    _short,
    frame_label,
    process_frames,
    python_frames,
    threads_of,
)
from hangtrace.tracer.process_model import ProcessRoles, assign_roles
from hangtrace.tracer.snapshot import ProcessInfo, Role

#: process states that take part in the graph (a dead process waits for nothing)
LIVE_STATES = ("alive", "unknown")


@dataclass(frozen=True)
class Target:
    """The actor method a wait is on: ``actor_id`` (hex), ``cls`` (class name, '' when
    unknown), ``method``."""

    actor_id: str
    cls: str
    method: str

    def text(self) -> str:
        """``RewardServer.score``."""
        return "%s.%s" % (self.cls or "actor %s" % self.actor_id[:8], self.method)


@dataclass(frozen=True)
class Wait:
    """One open wait of process ``key``: in ``method`` (its actor method / phase, or None),
    ``api`` ('get' | 'wait' | 'await'), on ``targets``, since ``since_wall_ns``; ``stopped``: ended
    by a stop of the process, not by a result."""

    key: str
    method: Optional[str]
    api: str
    thread: str
    since_wall_ns: int
    targets: Tuple[Target, ...]
    stopped: bool = False
    #: when the waiting method call began (its phase enter on the wait's thread; the call
    #: it waits on was made within it), else ``since_wall_ns``: the callee may start before
    #: the caller reaches ray.get / await
    call_wall_ns: int = 0

    def called(self) -> int:
        """The earliest time the awaited call can have been made (``call_wall_ns``)."""
        return self.call_wall_ns or self.since_wall_ns


@dataclass(frozen=True)
class ActorGraph:
    """``procs``: process key -> process (every process with a Ray identity); ``actor_of``:
    actor id -> process key (the newest process of an actor); ``waits``: process key -> its
    open waits (live processes only); ``edges``: process key -> [(target process key, the
    wait, the target)]; ``absent``: [(wait, target)] whose actor has no process;
    ``roles``: the process model's roles of ``procs`` (the driver is a launcher)."""

    procs: Mapping[str, ProcessInfo]
    actor_of: Mapping[str, str]
    waits: Mapping[str, Tuple[Wait, ...]]
    edges: Mapping[str, Tuple[Tuple[str, Wait, Target], ...]]
    absent: Tuple[Tuple[Wait, Target], ...]
    roles: ProcessRoles


def call_text(api: Optional[str]) -> str:
    """How a wait's call reads: ``ray.get``, ``ray.wait``, ``await`` (``api`` 'await')."""
    return "await" if api == "await" else "ray.%s" % (api or "get")


def label(p: ProcessInfo, roles: Optional[ProcessRoles] = None) -> str:
    """``RewardServer``, ``Engine 'engine-1'`` for an actor; ``driver`` for the Ray driver
    (role launcher, in ``roles`` of the process model or ``p.role``), else ``process host:pid``."""
    m = p.meta or {}
    if m.get("ray_actor_id"):
        cls = str(m.get("ray_actor_class") or "actor")
        return "%s '%s'" % (cls, m["ray_actor_name"]) if m.get("ray_actor_name") else cls
    role = roles.role(p) if roles is not None else p.role
    return "driver" if role == Role.LAUNCHER else "process %s" % p.key


def _doc(rec: Mapping[str, Any]) -> Dict[str, Any]:
    """The JSON text of a ``ray_wait`` record's ``group`` (``hooks/rayhooks/ray_calls.py``), {} when unreadable."""
    try:
        d = json.loads(rec.get("group") or "{}")
    except (ValueError, TypeError):
        return {}
    return d if isinstance(d, dict) else {}


def _targets(d: Mapping[str, Any]) -> Tuple[Target, ...]:
    ts = d.get("targets")
    return tuple(
        Target(str(t.get("actor_id") or ""), str(t.get("class") or ""), str(t.get("method") or "?"))
        for t in (ts if isinstance(ts, list) else ())
        if isinstance(t, dict) and t.get("actor_id")
    )


def targets_of(rec: Mapping[str, Any]) -> Tuple[Target, ...]:
    """The actor methods a ``ray_wait`` record waits on; () when unreadable."""
    return _targets(_doc(rec))


def open_waits(p: ProcessInfo) -> List[Wait]:
    """The open waits of ``p`` (module docstring), oldest first."""
    sm = p.summary
    out = []
    for r in sm.waits.values() if sm is not None else ():
        err = str(r.get("error") or "")
        stopped = r.get("state") == "failed" and err in STOP_ERRORS
        if r.get("state") != "issued" and not stopped:
            continue
        d = _doc(r)
        targets = _targets(d)
        if targets:
            out.append(
                Wait(
                    p.key,
                    r.get("phase"),
                    str(d.get("api") or "get"),
                    str(r.get("thread") or "?"),
                    int(r.get("t_wall_ns") or 0),
                    targets,
                    stopped,
                    _call_began(p, r),
                )
            )
    return sorted(out, key=lambda w: w.since_wall_ns)


def _call_began(p: ProcessInfo, r: Mapping[str, Any]) -> int:
    """The wall time of the newest enter of wait record ``r``'s phase on its thread before
    it (kept records of ``p``), or 0."""
    if not r.get("phase"):
        return 0
    sm = p.summary
    recs = list(sm.tail) if sm is not None and sm.tail else list(p.records or ())
    idx = int(r.get("idx") or 0)
    ts = [
        int(x.get("t_wall_ns") or 0)
        for x in recs
        if x.get("kind") == "phase_enter"
        and x.get("phase") == r.get("phase")
        and x.get("thread") == r.get("thread")
        and int(x.get("idx") or 0) < idx
    ]
    return max(ts, default=0)


def build(processes: Sequence[ProcessInfo]) -> ActorGraph:
    """The graph of ``processes`` (module docstring)."""
    procs = {p.key: p for p in processes if any(str(k).startswith("ray_") for k in (p.meta or {}))}
    actor_of: Dict[str, str] = {}
    for p in sorted(procs.values(), key=lambda q: q.start_wall_ns):
        aid = (p.meta or {}).get("ray_actor_id")
        if aid:
            actor_of[str(aid)] = p.key
    waits: Dict[str, Tuple[Wait, ...]] = {}
    edges: Dict[str, Tuple[Tuple[str, Wait, Target], ...]] = {}
    absent: List[Tuple[Wait, Target]] = []
    for key, p in procs.items():
        ws = [w for w in open_waits(p) if p.state in LIVE_STATES or w.stopped]
        if not ws:
            continue
        waits[key] = tuple(ws)
        out = []
        for w in ws:
            for t in w.targets:
                dst = actor_of.get(t.actor_id)
                if dst is None:
                    absent.append((w, t))
                else:
                    out.append((dst, w, t))
        edges[key] = tuple(out)
    return ActorGraph(procs, actor_of, waits, edges, tuple(absent), assign_roles(procs.values()))


def cycles(g: ActorGraph) -> List[List[str]]:
    """The cycles of waits: each strongly connected component of two or more processes,
    or one process waiting on itself; process keys in the order the waits run (from the
    member that waits longest)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    on: Dict[str, bool] = {}
    stack: List[str] = []
    comps: List[List[str]] = []
    counter = [0]

    def succ(v: str) -> List[str]:
        return [d for d, _, _ in g.edges.get(v, ()) if d in g.waits or d == v]

    for root in sorted(g.waits):
        if root in index:
            continue
        work: List[Tuple[str, int]] = [(root, 0)]
        while work:  # iterative Tarjan
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = counter[0]
                counter[0] += 1
                stack.append(v)
                on[v] = True
            nxt = succ(v)
            if i < len(nxt):
                work.append((v, i + 1))
                w = nxt[i]
                if w not in index:
                    work.append((w, 0))
                elif on.get(w):
                    low[v] = min(low[v], index[w])
                continue
            if work:
                u = work[-1][0]
                low[u] = min(low[u], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on[x] = False
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1 or v in succ(v):
                    comps.append(_in_wait_order(g, comp))
    return comps


def _in_wait_order(g: ActorGraph, comp: List[str]) -> List[str]:
    """The members of a cycle, starting at the longest waiter, following the waits."""
    members = set(comp)
    start = min(comp, key=lambda k: (min(w.since_wall_ns for w in g.waits[k]), k))
    order = [start]
    while True:
        nxt = next((d for d, _, _ in g.edges.get(order[-1], ()) if d in members and d not in order), None)
        if nxt is None:
            break
        order.append(nxt)
    return order + sorted(members - set(order))


def edge(g: ActorGraph, src: str, dst: str, method: Optional[str] = None) -> Optional[Tuple[Wait, Target]]:
    """The (oldest) wait of ``src`` on ``dst``, or None; with ``method``, a wait made by
    that method call of ``src`` first (the call others wait on, when ``src`` runs several)."""
    es = [(w, t) for d, w, t in g.edges.get(src, ()) if d == dst]
    return next((e for e in es if method is not None and e[0].method == method), es[0] if es else None)


def chain_ends(g: ActorGraph) -> Dict[str, List[str]]:
    """Process keys that others wait on (through any chain) but that wait on no live
    process themselves -> the waiters whose chain ends there (cycles excluded)."""
    out: Dict[str, List[str]] = {}
    for src in sorted(g.waits):
        seen = [src]
        cur = src
        while True:
            nxt = next((d for d, _, _ in g.edges.get(cur, ()) if d not in seen), None)
            if nxt is None:
                break
            seen.append(nxt)
            cur = nxt
        if cur != src and cur not in g.waits:
            out.setdefault(cur, []).append(src)
    return out


def started_since(p: ProcessInfo, method: str, since_wall_ns: int) -> Optional[bool]:
    """Did ``p`` enter ``method`` at or after ``since_wall_ns``? None when its kept records
    (``RingSummary.tail``) do not reach back that far."""
    sm = p.summary
    tail = list(sm.tail) if sm is not None else []
    recs = tail or list(p.records or ())
    if not recs:
        return None
    if any(
        r.get("kind") == "phase_enter"
        and r.get("phase") == method
        and (r.get("t_wall_ns") or 0) >= since_wall_ns
        for r in recs
    ):
        return True
    return False if (recs[0].get("t_wall_ns") or 0) <= since_wall_ns else None


def doing(p: ProcessInfo) -> Optional[str]:
    """What the actor at a chain's end does: the await chain of its event loop (an async
    actor's method is a task there: ``analyze/stuck/asynctasks.py``), else why its stack looks
    blocked (``analyze/stuck/blocking.py``); None when neither is known."""
    loop = describe_loop(p)
    if loop:
        return loop
    frames, thread = process_frames(p)
    return blocking_reason(frames, thread=thread) if frames else None


#: an asyncio event loop running a callback or task step (asyncio/events.py, base_events.py)
_LOOP_FRAMES = frozenset({("events.py", "_run"), ("base_events.py", "_run_once")})


def wait_site(p: ProcessInfo, method: Optional[str]) -> Optional[Dict[str, Any]]:
    """Where ``p`` waits inside ``method`` (the innermost frame of the user's code at or
    inside the method's frame: blind helper 61's wait was in a helper the method called):
    ``{'at': 'RolloutManager.rollout (driver.py:77)',
    'code': 'score = ray.get(...)', 'blocks_loop': True}`` from the first thread whose
    frames pass through a frame of that method (an async actor runs its methods on
    Ray's "AsyncIO Thread", not the main thread). ``blocks_loop``: the frame runs inside
    an asyncio event loop's step and the thread is blocked in a call, not suspended at an
    ``await`` (a coroutine at an ``await`` has no frame on the stack): the loop can run
    nothing else meanwhile (blind helper 64: a synchronous ``ray.get`` inside an async
    actor's method, whose callback into the actor never ran). None when no stack shows it."""
    if not method:
        return None
    for t in threads_of(p) or ():
        fs = python_frames(t)
        at = next((i for i, f in enumerate(fs) if _short(f.get("name")) == method), None)
        if at is None:
            continue
        # the line that waits: the user's innermost frame at or inside the method (a helper it calls)
        f = next((x for x in fs[: at + 1] if user_code(x)), fs[at])
        loop = any(
            (str(x.get("filename") or "").rsplit("/", 1)[-1], _short(x.get("name"))) in _LOOP_FRAMES
            for x in fs[at + 1 :]
        )
        return {"at": frame_label(f), "code": f.get("code"), "blocks_loop": bool(loop and at > 0)}
    return None
