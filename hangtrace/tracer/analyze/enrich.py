"""Enrichment after the verdict: Ray identity and Ray's own death record (issue 4; meta
from hooks/rayhooks/ray_hooks.py and collect/ray/rayjoin.joined), memory ledger, trends and
attribution (issue 5), dead helper threads, ranks outside the common stack frame (pure;
never raises on odd data). Ray's text is reported as Ray's, beside the cause found."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

from hangtrace.tracer.analyze.failures.exceptions import RECENT_NS, survived, swallowed_since
from hangtrace.tracer.analyze.actors.raysays import ray_says
from hangtrace.tracer.analyze.context import Ctx
from hangtrace.tracer.analyze.failures.causes import raised_phases
from hangtrace.tracer.analyze.stuck.stacktree import format_ranks
from hangtrace.tracer.analyze.memory.samples import fmt_bytes
from hangtrace.tracer.diagnosis import Cause, Diagnosis, Kind
from hangtrace.tracer.snapshot import ProcessInfo


def ray_actor(p: ProcessInfo) -> Optional[Dict[str, Any]]:
    """Ray actor identity of a process (from its ring meta), or None."""
    m = p.meta or {}
    if not (m.get("ray_actor_class") or m.get("ray_actor_name") or m.get("ray_actor_id")):
        return None
    return {
        "class": m.get("ray_actor_class"),
        "name": m.get("ray_actor_name") or None,
        "actor_id": m.get("ray_actor_id"),
        "node_id": m.get("ray_node_id"),
        "job_id": m.get("ray_job_id"),
        "pid": p.pid,
    }


def _ray_label(a: Dict[str, Any]) -> str:
    return "%s%s" % (a.get("class") or "actor", " '%s'" % a["name"] if a.get("name") else "")


def rankless_actor_failures(ctx: Ctx, d: Diagnosis) -> None:
    """A verdict over ranks, with Ray actors without a rank that failed (a method that
    raised, a death): ``details['actor_failures']`` and an evidence line each, saying
    whether it came before the hang began - a rollout engine that crashed while the
    trainers went on to mismatch is a candidate root the rank rules cannot weigh."""
    if d.culprit_actors or not d.culprit_ranks:
        return
    from hangtrace.tracer.analyze.rules.actors import actor_failures

    fails = actor_failures(ctx)
    if not fails:
        return
    start = int(d.details.get("hang_start_wall_ns") or 0)
    d.details["actor_failures"] = [
        {"actor": lab, "cause": c, "wall_ns": t, "text": tx[:300], "process": key}
        for t, lab, c, tx, key in fails[:8]
    ]
    for t, lab, c, tx, key in fails[:3]:
        ctx.add(
            "Ray actor %s (%s, no rank) failed%s: %s"
            % (
                lab,
                key,
                " BEFORE the hang began - a candidate root" if start and t and t < start else "",
                (tx or c)[:200],
            )
        )


def ray_details(ctx: Ctx, d: Diagnosis) -> None:
    """``details['ray_actors']``, ``['culprit_actors']``, ``['ray_says']`` and evidence."""
    actors: Dict[str, Dict[str, Any]] = {}
    for r, p in ctx.procs.items():
        a = ray_actor(p)
        if a is not None:
            actors[str(r)] = a
    if actors:
        d.details["ray_actors"] = actors
        d.details["culprit_actors"] = [
            dict(actors[str(r)], rank=r) for r in d.culprit_ranks if str(r) in actors
        ]
        for a in d.details["culprit_actors"][:4]:
            ctx.add(
                "rank %d is Ray actor %s (actor id %s, node %s, pid %d)"
                % (
                    a["rank"],
                    _ray_label(a),
                    (a.get("actor_id") or "?")[:16],
                    (a.get("node_id") or "?")[:12],
                    a["pid"],
                )
            )
    says: Dict[str, Dict[str, Any]] = {}
    focus: List[Any] = list(d.culprit_ranks) + [c.get("rank") for c in d.cascade or ()]
    for r in focus:
        x = ray_says(ctx.procs.get(r) if r is not None else None)
        if x and str(r) not in says:
            says[str(r)] = x
    if says:
        d.details["ray_says"] = says
        for r in d.culprit_ranks[:4]:
            x = says.get(str(r))
            if x:
                ctx.add(
                    "rank %d: Ray says%s: %s%s"
                    % (
                        r,
                        "" if x.get("source") == "state-api" else " (%s)" % x.get("source"),
                        " ".join(str(x["text"]).split())[:400],
                        " [worker exit %s]" % x["exit_type"]
                        if x.get("exit_type") and x.get("source") == "state-api"
                        else "",
                    )
                )
                if d.kind == Kind.DEAD_RANK:
                    ctx.add(
                        "rank %d: Ray's text is Ray's own record; the cause hangtrace's evidence supports "
                        "is '%s'" % (r, d.cause)
                    )


def _label(p: ProcessInfo) -> str:
    from hangtrace.tracer.analyze.rules.actors import actor_label

    if (p.meta or {}).get("ray_actor_class"):
        return ("rank %d = " % p.rank if p.rank >= 0 else "") + actor_label(p)
    return "rank %d" % p.rank if p.rank >= 0 else "pid %d" % p.pid


def memory_monitor_holders(ctx: Ctx, d: Diagnosis) -> None:
    """A process killed by Ray's memory monitor (cause 'ray-memory-monitor'): the job's
    largest memory holders at the kill beside it (``analyze/memory/holders.py``; Ray kills
    by policy, not the process holding the memory): ``details['memory_holders']``
    {'killed': {label, pid, rss}, 'holders': [{process, pid, label, rss, source}]} (bytes)
    and an evidence line."""
    if d.kind != Kind.DEAD_RANK or d.cause != Cause.RAY_MEMORY_MONITOR.value:
        return
    key = d.details.get("culprit_process")
    if not key and d.culprit_ranks and d.culprit_ranks[0] in ctx.procs:
        key = ctx.procs[d.culprit_ranks[0]].key
    proc = next((p for p in ctx.snap.processes if p.key == key), None)
    if proc is None:
        return
    from hangtrace.tracer.analyze.memory.holders import _rss_at, holders
    from hangtrace.tracer.collect.ray.raylogs import RayOomKill

    at = int(d.details.get("fail_wall_ns") or 0)
    rk_ = (proc.memory_facts or {}).get("ray_oom_kill")
    kill = RayOomKill.from_dict(rk_) if rk_ else None
    hs = holders(ctx.snap.processes, at, proc.key, _label, kill)
    rss = _rss_at(proc, at)
    if rss is None and kill is not None:
        rss = next((w.memory for w in kill.workers if w.selected and w.pid == proc.pid), None)
    d.details["memory_holders"] = {
        "killed": {"label": _label(proc), "pid": proc.pid, "rss": rss},
        "holders": [h.to_dict() for h in hs],
    }
    ctx.add(
        "Ray's memory monitor killed %s (pid %d, %s at the kill); the largest memory holder(s) then: %s"
        % (
            _label(proc),
            proc.pid,
            "RSS %s" % fmt_bytes(rss) if rss is not None else "memory unknown",
            "; ".join(
                "%s (pid %d, %s, %s)"
                % (h.label, h.pid, fmt_bytes(h.rss), "our samples" if h.source == "samples" else "Ray's log")
                for h in hs
            )
            or "none sampled",
        )
    )


def memory_details(ctx: Ctx, d: Diagnosis) -> None:
    """``details['memory']`` (analyze.memory.summarize) and memory evidence lines for the
    culprits. Skipped silently when no process sampled memory; never raises."""
    try:
        from hangtrace.tracer.analyze.memory import summarize

        focus = list(d.culprit_ranks) + [
            c.get("rank") for c in d.cascade or () if c.get("rank") not in d.culprit_ranks
        ]
        atts = {r: ctx.views[r].mem for r in focus if r in ctx.views and ctx.views[r].mem}
        # (the SIGTERM advice stands only for a rank whose SIGTERM is the verdict's cause,
        # not for one the launcher stopped after the root)
        mem = summarize(
            ctx.procs,
            focus,
            atts,
            sigterm_culprits=set(d.culprit_ranks) if d.kind == Kind.DEAD_RANK else set(),
        )
    except Exception as e:
        ctx.add("memory analysis failed: %r" % (e,))
        return
    if mem is None:
        return
    d.details["memory"] = mem
    if d.kind == Kind.DEAD_RANK and d.culprit_ranks:
        _phase_of_oom(d, atts.get(d.culprit_ranks[0]) or {})
    for ln in _memory_lines(d, atts, mem)[:10]:
        if ln not in ctx.evidence:
            ctx.add(ln)


def _phase_of_oom(d: Diagnosis, a: Dict[str, Any]) -> None:
    """Set ``d``'s missing phase / step from the CUDA OOM of its culprit's attribution ``a``."""
    c = a.get("cuda_oom") or {}
    if d.phase is None and c.get("phase"):  # the phase the OOM left, not the (empty) current one
        d.phase = c["phase"]
    if d.step is None and c.get("step") is not None:
        d.step = c["step"]


def _memory_lines(
    d: Diagnosis, atts: Mapping[Any, Optional[Dict[str, Any]]], mem: Dict[str, Any]
) -> List[str]:
    """The memory evidence lines: the culprits' attributions (``atts``), then the summary
    ``mem``'s own lines when it flags something significant."""
    lines: List[str] = []
    for r in d.culprit_ranks[:4]:
        att = atts.get(r)
        if att:
            lines += ["rank %d: %s" % (r, e) for e in att.get("evidence") or ()]
    try:
        from hangtrace.tracer.analyze.memory import significant

        flags, trends = significant(mem, d.cause)
    except Exception:
        flags, trends = [], []
    if flags or trends:  # small kept/grown bytes stay in details['memory'] (text report)
        lines += mem.get("evidence") or []
    return lines


def _stopped_after_exception(d: Diagnosis, r: int, proc: Any) -> None:
    """A culprit stuck outside collectives whose phase or actor method raised and has
    not completed since (``causes.raised_phases``): ``details['after_exception']`` names it, for the paragraph -
    e.g. a Ray trainer whose ``train_step`` raised lives on, idle, while its peers wait."""
    if d.kind != Kind.STUCK_OUTSIDE_COLLECTIVE or "after_exception" in d.details:
        return
    failed = raised_phases(proc)
    if failed:
        t, name, err, step = failed[-1]
        d.details["after_exception"] = "rank %d's %s left %s '%s'%s, which it has not run since" % (
            r,
            err[:300],
            "method" if proc.meta.get("ray_actor_id") else "phase",
            name,
            " at step %s" % step if step is not None else "",
        )
        return
    # an asyncio task nobody awaited or a thread that died shortly before the hang began:
    # most likely the producer of what the culprit waits for (blind helper 80: a rollout
    # task's KeyError, the trainer in `await queue.get()`)
    start = int(d.details.get("hang_start_wall_ns") or 0)
    x = swallowed_since(proc, start - RECENT_NS) if start else None
    if x is not None and str(d.cause) != Cause.BUSY.value:
        d.details["after_exception"] = (
            "rank %d's %s; if it fed what rank %d waits for, that is why it waits" % (r, x.line(), r)
        )
        d.details["after_exception_source"] = x.source


def thread_and_stack_notes(ctx: Ctx, d: Diagnosis) -> None:
    """Evidence: helper threads of the culprits that died earlier, asyncio tasks whose
    exception nobody retrieved (issue 9, ``hooks/process/failures.py``), phases an exception
    left (not repeated when a tie-break line already names it); ranks outside the frame
    most ranks share."""
    for r in d.culprit_ranks[:4]:
        v = ctx.views.get(r)
        for e in (v.proc.events or ()) if v else ():
            if isinstance(e, dict) and e.get("event") == "thread_exception":
                ctx.add(
                    "rank %d: thread %s died earlier with %s: %s (a dead producer/helper thread?)"
                    % (
                        r,
                        e.get("thread") or "?",
                        e.get("type") or "Exception",
                        str(e.get("message") or "")[:160],
                    )
                )
        if v is None or v.dead:
            continue
        _stopped_after_exception(d, r, v.proc)
        for x in survived(v.proc)[-3:]:
            if x.source in ("asyncio-task", "phase") and not any(x.text[:60] in ln for ln in ctx.evidence):
                ctx.add(
                    "rank %d: %s%s"
                    % (
                        r,
                        x.line(),
                        " - the exception was swallowed: the process lives on"
                        if x.source == "asyncio-task"
                        else "",
                    )
                )
    miss = d.details.get("missing_from_common_frame")
    if miss and miss["missing"] and len(miss["missing"]) <= 16:
        one = len(miss["missing"]) == 1
        ctx.add(
            "stacks: %d ranks share %s; %s %s %s not in it"
            % (
                miss["ranks_in"],
                miss["frames"][-1] if miss["frames"] else "?",
                "rank" if one else "ranks",
                format_ranks(miss["missing"], 8),
                "is" if one else "are",
            )
        )
