"""Rule *actors* -> a verdict over Ray actors that have no rank (issue 9, item 3).

Used when no traced process has a rank (producers and consumers, rollout engines, reward
workers, controllers: most processes of an RL stack): before this rule such snapshots
were "Unknown: no traced process with a rank".

Failures of each rank-less actor (``Role.RAY_ACTOR``, rank -1), by time:

* a method that raised and has not completed since (``causes.raised_phases``: the
  actor-method phases of ``hooks/rayhooks/ray_hooks.py`` end 'failed' with ``Type: message``;
  a queue's ``Empty`` / ``Full`` is control flow, and methods of Ray's own
  infrastructure actors - ``config.RAY_INFRA_ACTORS``, the actor behind
  ``ray.util.queue.Queue`` - are their callers' work: neither is a failure). A
  ``SystemExit`` / ``KeyboardInterrupt`` (``causes.STOP_ERRORS``) is how Ray ends a
  worker it stops (SIGTERM, ``ray.shutdown``, ``ray.kill``): that is the death below,
  not a failure of the method;
* an asyncio task of the actor whose exception nobody retrieved (event
  ``task_exception`` of ``hooks/process/failures.py``: a fire-and-forget producer task that
  died while the actor lives on);
* a death (``deaths.fill_death``: killed, non-zero exit, fatal signal, SIGTERM while in a
  method, with the memory refinements: Ray's memory monitor, host OOM kill).

The earliest failure is the root: ``dead-rank`` with ``culprit_actors`` naming the actor
(``Class 'name'``) and the cause (``exception`` for a method that raised, the death's cause
otherwise); later failures are its cascade. With no failure and the job stalled, the
actors inside a method are named ``stuck-outside-collective`` (cause ``blocked``), each
with its method. Otherwise the rule does not find.

Known limit: a method failure its caller handled (and did not retry with success) is
still a failure here; a retried method that completed is not (its newest exit completed).
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Tuple

from hangtrace.tracer.analyze.actors import actorgraph as G
from hangtrace.tracer.analyze.actors.raysays import ray_says
from hangtrace.tracer.analyze.stuck.blocking import blocking_reason
from hangtrace.tracer.analyze.context import Ctx
from hangtrace.tracer.analyze.rankview import RankView, index_process
from hangtrace.tracer.analyze.failures.deaths import fill_death
from hangtrace.tracer.analyze.failures.causes import raised_phases
from hangtrace.tracer.analyze.evidence import ts
from hangtrace.tracer.stackmodel.usercode import user_frame
from hangtrace.tracer.analyze.failures.exceptions import survived
from hangtrace.tracer.analyze.rules.base import Finding
from hangtrace.tracer.analyze.stuck.stacktree import frame_label, process_frames
from hangtrace.tracer.config import ray_infra_actor
from hangtrace.tracer.diagnosis import Cause, Diagnosis, Kind
from hangtrace.tracer.process_model import assign_roles
from hangtrace.tracer.report.clip import clip
from hangtrace.tracer.snapshot import ProcessInfo, Role

NAME = "actors"

#: One failure: (wall ns, actor label, cause value, text, process key)
Failure = Tuple[int, str, str, str, str]


def actor_label(p: ProcessInfo) -> str:
    """``Producer`` / ``Engine 'engine-1'`` for a Ray actor process (class and name from
    its own ring, ``hooks/rayhooks/ray_hooks.py``)."""
    m = p.meta or {}
    cls = str(m.get("ray_actor_class") or "actor")
    return "%s '%s'" % (cls, m["ray_actor_name"]) if m.get("ray_actor_name") else cls


def rankless_actors(ctx: Ctx) -> List[ProcessInfo]:
    """Processes of the snapshot that are Ray actors without a rank."""
    return [p for p in ctx.snap.processes if p.role == Role.RAY_ACTOR and (p.rank is None or p.rank < 0)]


def infrastructure(p: ProcessInfo) -> bool:
    """Is ``p`` one of Ray's own infrastructure actors (``config.RAY_INFRA_ACTORS``: the
    actor behind ``ray.util.queue.Queue`` ...)? Its methods' exceptions are its callers'
    control flow, never a failure."""
    m = p.meta or {}
    return ray_infra_actor(m.get("ray_actor_module"), m.get("ray_actor_class"))


def _failures(p: ProcessInfo, v: RankView) -> List[Failure]:
    label = actor_label(p)
    out: List[Failure] = (
        []
        if infrastructure(p)
        else [
            (t, label, Cause.EXCEPTION.value, "method %s raised %s" % (method, clip(err, 300)), p.key)
            for t, method, err, _ in raised_phases(p)
        ]
    )
    out += [
        (x.wall_ns, label, Cause.EXCEPTION.value, x.line(), p.key)  # the process lived on
        for x in survived(p)
        if x.source == "asyncio-task"
    ]
    if v.dead and not v.victim:
        out.append((int(v.fail_wall or 0), label, str(v.cause), str(v.cause_text or ""), p.key))
    return out


def _views(ctx: Ctx) -> List[Tuple[ProcessInfo, RankView]]:
    """Each rank-less actor with its view, deaths filled (``deaths.fill_death``)."""
    out = []
    for p in rankless_actors(ctx):
        v = index_process(-1, p)
        fill_death(v)
        out.append((p, v))
    return out


def _by_time(fails: List[Failure]) -> List[Failure]:
    return sorted(fails, key=lambda f: (f[0] or 1 << 62, f[1]))


def actor_failures(ctx: Ctx) -> List[Failure]:
    """Every failure of a rank-less Ray actor of the snapshot, by time (see the module
    docstring): what the ranked verdicts cannot see."""
    return _by_time([f for p, v in _views(ctx) for f in _failures(p, v)])


def find(ctx: Ctx) -> Optional[Finding]:
    """``data``: ('failed', root, later failures) or ('stuck', [(label, method, key)])."""
    views = _views(ctx)
    fails = _by_time([f for p, v in views for f in _failures(p, v)])
    if fails:
        return Finding(NAME, (), fails[0][0], data=("failed", fails[0], fails[1:]))
    stuck = [(actor_label(p), str(v.phase), p.key) for p, v in views if p.state == "alive" and v.phase]
    if ctx.stalled and stuck:
        return Finding(NAME, (), 0, data=("stuck", stuck))
    return None


def explain(ctx: Ctx, finding: Finding, d: Diagnosis) -> None:
    """``culprit_actors``, cause and ``details['cause_text']`` / ``['actor_methods']``;
    the cascade lists later actor failures (``actor`` instead of ``rank``: -1)."""
    what, *rest = finding.data
    if what == "failed":
        root, later = rest
        t, label, cause, text, key = root
        d.kind, d.cause = Kind.DEAD_RANK, cause
        d.culprit_actors = [label]
        d.details["cause_text"] = text
        d.details["fail_wall_ns"] = t
        d.details["culprit_process"] = key
        ctx.add(
            "Ray actor %s (%s, no rank) failed first%s: %s"
            % (label, key, " at %s" % ts(t) if t else "", text or cause)
        )
        d.cascade = [
            {"rank": -1, "actor": lab, "cause": c, "wall_ns": tw, "text": tx[:300], "victim": False}
            for tw, lab, c, tx, _ in later
        ]
        for c in d.cascade[:6]:
            ctx.add("later: Ray actor %s: %s" % (c["actor"], c["text"] or c["cause"]))
        proc = next((p for p in ctx.snap.processes if p.key == key), None)
        if proc is not None:
            _lives_on(ctx, proc, text, d)
        says = ray_says(proc)
        if says:  # Ray's own record of the death, beside ours (analyze/actors/raysays.py)
            d.details["ray_says"] = {label: says}
            src = "" if says["source"] == "state-api" else " (%s)" % says["source"]
            ctx.add("Ray actor %s: Ray says%s: %s" % (label, src, " ".join(str(says["text"]).split())[:400]))
        return
    stuck: List[Tuple[str, str, str]] = rest[0]
    d.kind, d.cause = Kind.STUCK_OUTSIDE_COLLECTIVE, Cause.BLOCKED
    d.culprit_actors = sorted({lab for lab, _, _ in stuck})
    methods: Dict[str, Any] = {}
    for lab, method, key in stuck:
        methods.setdefault(lab, []).append(method)
        ctx.add(
            "Ray actor %s (%s, no rank) is inside method %s and the job made no progress" % (lab, key, method)
        )
    d.details["actor_methods"] = methods
    procs = {p.key: p for p in ctx.snap.processes}
    doings = [(lab, G.doing(procs[key])) for lab, _m, key in stuck[:6] if key in procs]
    doing = doings[0][1] if doings else None
    d.details["culprit_process"] = stuck[0][2]
    if doing:  # what its method waits for: the await chain or why its stack looks blocked, with the line
        d.details["actor_doing"] = doing
        ctx.add("Ray actor %s: %s" % (stuck[0][0], doing))
    for lab, other in doings[1:]:  # (several actors blocked alike: blind helper 60's two rollout actors)
        if other:
            ctx.add("Ray actor %s: %s" % (lab, other))
    if len(doings) > 1 and doing and all(_alike(x, doing) for _l, x in doings[1:]):
        d.details["actor_doing_all"] = (
            True  # every stuck actor waits the same way (the paragraph says "each")
        )
    driver = driver_wait(ctx)
    if driver:
        d.details["driver_wait"] = driver
        ctx.add(driver)


_NUMBERS = re.compile(r"\d+")


def _alike(a: Optional[str], b: str) -> bool:
    """The same wait in two processes: equal texts once numbers (fds, pids, ports, lines of
    the same call) are left out."""
    return a is not None and _NUMBERS.sub("#", a) == _NUMBERS.sub("#", b)


def driver_wait(ctx: Ctx) -> Optional[str]:
    """``"the driver waits in ray.get at main (driver.py:150)"`` when the Ray driver's stack
    is in a Ray wait (its ``ray.get`` of a reference it did not create, e.g. one an actor
    returned, leaves no wait record to follow); None otherwise."""
    roles = assign_roles(ctx.snap.processes)  # (ctx.roles covers the ranks only)
    for p in ctx.snap.processes:
        if G.label(p, roles) != "driver" or p.state not in ("alive", "unknown"):
            continue
        frames, thread = process_frames(p)
        why = blocking_reason(frames, thread=thread) if frames else None
        if why and why.startswith("ray.get/ray.wait"):
            user = user_frame(frames or [])
            return "the driver waits in ray.get/ray.wait%s" % (
                " at %s" % frame_label(user) if user is not None else ""
            )
    return None


def _lives_on(ctx: Ctx, p: ProcessInfo, text: str, d: Diagnosis) -> None:
    """The root failure is an asyncio task of live actor ``p`` that died unseen (``text``
    its line): what the actor does now (``details['actor_lives_on']``: its method and await
    chain), who waits on it (``['actor_waiters']``: the waits on its methods, or the
    driver's ``ray.get``: ``['driver_wait']``), and ``['after_exception_source']`` for the
    advice. Blind helper 84: a rollout actor's generation task died of KeyError; the
    verdict named it, but not that ``get_batch`` waits forever in ``await queue.get()`` and
    the driver in ``ray.get`` on it."""
    if p.state not in G.LIVE_STATES or not any(
        x.source == "asyncio-task" and x.line() == text for x in survived(p)
    ):
        return
    d.details["after_exception_source"] = "asyncio-task"
    doing = G.doing(p)
    d.details["actor_lives_on"] = {"method": p.phase, "doing": doing}
    label = actor_label(p)
    if p.phase or doing:
        ctx.add(
            "Ray actor %s lives on%s%s"
            % (label, " in method %s" % p.phase if p.phase else "", ": %s" % doing if doing else "")
        )
    g = ctx.cache.get("actorgraph")
    if g is None:
        g = ctx.cache["actorgraph"] = G.build(ctx.snap.processes)
    waiters: List[Dict[str, Any]] = []
    for k in sorted(g.waits):
        for dst, w, t in g.edges.get(k, ()):
            if dst != p.key:
                continue
            who = G.label(g.procs[k], g.roles)
            waiters.append(
                {
                    "actor": who,
                    "method": w.method,
                    "api": w.api,
                    "waits_on": label,
                    "target_method": t.method,
                    "since_wall_ns": w.since_wall_ns,
                }
            )
            ctx.add(
                "%s%s waits (%s since %s) on %s.%s"
                % (
                    who,
                    " in %s" % w.method if w.method else "",
                    G.call_text(w.api),
                    ts(w.since_wall_ns),
                    label,
                    t.method,
                )
            )
    if waiters:
        d.details["actor_waiters"] = waiters
        return
    driver = driver_wait(ctx)
    if driver:
        d.details["driver_wait"] = driver
        ctx.add(driver)
