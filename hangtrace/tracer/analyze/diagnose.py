"""Pure analysis: a ``Snapshot`` in, one ``Diagnosis`` out (no I/O, no processes).

The algorithm (docs/ARCHITECTURE.md, "Analysis"): index every rank (``context``), build
the wait-for graph (``waitgraph``), find the hang with the first hang rule that finds
(``rules.HANG_RULES``), find the root death (``rules.dead_rank``), let the arbiter's
decision table choose (``arbiter``), let the chosen rule explain itself, then enrich
(``enrich``: Ray, memory) and write the verdict paragraph (``report.paragraph``). Each
rule's docstring says when it fires. Ranks are global ranks; times are ns since the
Unix epoch unless a name says ``_s``. Performance: one pass over every record list plus
work linear in the group sizes of the instances ranks are blocked in.
"""

from __future__ import annotations

from typing import Optional, Sequence

from hangtrace.tracer.analyze.failures.shutdown import cleaned
from hangtrace.tracer.analyze import enrich
from hangtrace.tracer.analyze.arbiter import Outcome, Situation, decide
from hangtrace.tracer.analyze.context import DEFAULT_STALL_S, Ctx
from hangtrace.tracer.process_model import process_argv
from hangtrace.tracer.analyze.failures.deaths import first_rankless_death, failures, stopped_after_stall
from hangtrace.tracer.analyze.failures.causes import TRANSPORT_MARKERS, is_transport_error
from hangtrace.tracer.analyze.evidence import rk, stall_note
from hangtrace.tracer.analyze.actors.actorgraph import open_waits
from hangtrace.tracer.analyze.stuck.childwait import child_process
from hangtrace.tracer.analyze.graph.groupdefs import explain_split
from hangtrace.tracer.analyze.stuck.peerwait import peer_waits
from hangtrace.tracer.analyze.stuck.lockwait import lock_waits
from hangtrace.tracer.analyze.stuck.pollwait import poll_waits
from hangtrace.tracer.analyze.failures.replacement import replacement
from hangtrace.tracer.analyze.straggler import straggler_details
from hangtrace.tracer.analyze.stuck.loaderwait import loader_workers
from hangtrace.tracer.analyze.rules import (
    ACTOR_RULES,
    ACTORS,
    BY_NAME,
    DEATH_RULE,
    FALLBACK_RULES,
    HANG_RULES,
    RANKLESS_ROOT,
    STACK_ONLY,
    TIMEOUT_WAITER,
    Finding,
)
from hangtrace.tracer.analyze.stuck.stacktree import classes as stack_classes_of
from hangtrace.tracer.analyze.frameworks import framework_line, frameworks_seen
from hangtrace.tracer.analyze.stuck.stacktree import format_ranks, merge_stacks, missing_from_common_frame
from hangtrace.tracer.analyze.graph.waitgraph import build_instances
from hangtrace.tracer.diagnosis import Cause, Diagnosis, Kind
from hangtrace.tracer.envfacts import ProcessEnv
from hangtrace.tracer.snapshot import Snapshot

__all__ = ["diagnose", "TRANSPORT_MARKERS", "is_transport_error", "DEFAULT_STALL_S"]

MAX_EVIDENCE = 40


def _graph(ctx: Ctx) -> Optional[Finding]:
    """(Re)build the wait-for graph; the first hang rule that finds, or None."""
    ctx.insts, ctx.inst_of = build_instances(ctx)
    ctx.cache.clear()
    if not ctx.insts or ctx.advanced_in_window or (ctx.unread_in_window and not ctx.stalled):
        # a process advanced in the snapshot's window: whatever waits, it is not hung; a ring
        # vanished in it (the run directory deleted): hung only past the stall threshold
        return None
    return next((f for f in (rule.find(ctx) for rule in HANG_RULES) if f is not None), None)


def _stopped_job(ctx: Ctx) -> Optional[Finding]:
    """Every rank killed long after its last progress: the job was stopped because it
    hung. Returns the hang found with the deaths as victims, or None (deaths restored)."""
    stopped = stopped_after_stall(ctx)
    if stopped is None:
        return None
    for v in ctx.views.values():
        v.victim = True
    hang = _graph(ctx)
    if hang is not None:
        ctx.add(
            "every rank died within %.0f s, at least %.0f s after its last progress: the job was "
            "stopped after it hung; the deaths are listed as cascade" % stopped[:2]
        )
        return hang
    for r, was in stopped[2].items():
        ctx.views[r].victim = was
    _graph(ctx)
    return None


def _preamble(ctx: Ctx, d: Diagnosis) -> None:
    """Evidence about the snapshot itself: bad headers, ranks without file, duplicates."""
    for ln in ctx.bad[:10]:
        ctx.add(ln)
    if len(ctx.bad) > 10:
        ctx.add("... %d more processes with an implausible rank/world size" % (len(ctx.bad) - 10))
    if ctx.nofile:
        ctx.add(
            "%s: no record file (world size %d): not traced, or file lost/unreadable"
            % (
                (
                    rk(ctx.nofile, 12)
                    if ctx.nmissing == len(ctx.nofile)
                    else "%d ranks (first: %s)" % (ctx.nmissing, format_ranks(ctx.nofile[:12], 12))
                ),
                ctx.world,
            )
        )
    for r, kind, kept, others in ctx.dups[:5]:
        if kind == "restart" and r in ctx.replaced:  # analyze/failures/lonerestart.py
            ctx.add(
                "rank %d: restarted alone (earlier process %s, newest %s) while the other ranks kept their "
                "processes: %s, the one that died, is analysed"
                % (r, ", ".join(others), kept, ctx.replaced[r][0].key)
            )
        elif kind == "restart":
            ctx.add(
                "rank %d: restarted (earlier process %s); the newest, %s, is analysed"
                % (r, ", ".join(others), kept)
            )
        elif kind == "inherited":
            ctx.add(
                "rank %d: its child process %s joined or asked to join the job's process group as rank %d too (it "
                "inherited the rank's RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT); %s is rank %d"
                % (r, ", ".join(others), r, kept, r)
            )
        else:
            ctx.add(
                "rank %d: several processes joined or asked to join as this rank at the same time (%s and "
                "%s): conflicting launches; %s is analysed" % (r, ", ".join(others), kept, kept)
            )
    tree = merge_stacks(ctx.procs[r] for r in sorted(ctx.procs))
    if tree.ranks:
        d.stack_classes = stack_classes_of(tree)
        miss = missing_from_common_frame(tree)
        if miss:
            d.details["missing_from_common_frame"] = miss


def diagnose(
    snapshot: Snapshot,
    now_wall_ns: Optional[int] = None,
    stall_s: Optional[float] = None,
    envs: Sequence[ProcessEnv] = (),
) -> Diagnosis:
    """Diagnose ``snapshot``; return a ``Diagnosis`` (docs/DIAGNOSIS.md).

    ``now_wall_ns``: "now" for ages (ns since the epoch); default the snapshot's
    ``taken_wall_ns``, else the newest time in the records. ``stall_s``: seconds without
    progress anywhere after which "everybody inside one collective" is a stall rather than
    'progressing' (default 300, the watcher's default). ``envs``: the run's environment
    records (``collect.forensics.run_env``; rules that compare ranks' environments read
    them). Pure: no I/O; never raises on odd records (missing keys read as None).
    """
    snapshot, shut = cleaned(snapshot)  # a clean shutdown is no death (failures/shutdown.py)
    ctx = Ctx(snapshot, now_wall_ns, stall_s, envs)
    for line in shut[:12]:
        ctx.add(line)
    d = Diagnosis(kind=Kind.UNKNOWN)
    d.errors = list(snapshot.errors or [])
    stacks_only = STACK_ONLY.find(ctx)
    if stacks_only is not None:  # attach: no flight records, the stacks rule says it all
        STACK_ONLY.explain(ctx, stacks_only, d)
        return d
    d.details.update(
        world_size=ctx.world,
        ranks_with_records=len(ctx.views),
        missing_ranks=ctx.nofile,
        last_progress_wall_ns=ctx.last_progress,
        last_progress_age_s=ctx.age_s,
        stalled=ctx.stalled,
    )
    if ctx.window is not None:
        _window_evidence(ctx, d)
    if not ctx.views:
        found = _rankless(ctx)  # Ray actors without a rank (issue 9)
        if found is not None:
            BY_NAME[found.rule].explain(ctx, found, d)
            return _finish(ctx, d)
        d.cause = Cause.NO_DATA
        died = first_rankless_death(snapshot.processes)  # e.g. a launcher that failed before its ranks
        d.summary = "No traced process with a rank in the snapshot%s." % (
            " (%d unreadable file(s), see errors)" % len(d.errors) if d.errors else ""
        )
        if died:
            who = "%s (%s)" % (died[0].key, " ".join(process_argv(died[0])) or "?")
            d.details["rankless_death"] = {
                "process": who,
                "cause": died[1].cause,
                "cause_text": died[1].cause_text,
            }
            ctx.add("%s died: %s" % (who, died[1].cause_text))
        ctx.add("%d process(es), %d without a rank" % (len(snapshot.processes), ctx.unranked))
        for ln in ctx.bad[:10]:
            ctx.add(ln)
        return _finish(ctx, d)
    _preamble(ctx, d)
    hang = _graph(ctx)
    if hang is None:
        hang = _stopped_job(ctx)
    d.waiting_ranks = sorted(ctx.inst_of)
    death = DEATH_RULE.find(ctx)
    fails = failures(ctx)
    rankless = RANKLESS_ROOT.find(ctx)  # issue 9: a rank-less Ray actor's failure beside the ranks
    timeout = TIMEOUT_WAITER.find(ctx) if hang is None else None
    row = decide(ctx, Situation(hang, death, bool(fails), rankless, timeout))
    if row.outcome is Outcome.RANKLESS and rankless is not None:
        RANKLESS_ROOT.explain(ctx, rankless, d)
    elif row.outcome is Outcome.TIMEOUT and timeout is not None:
        TIMEOUT_WAITER.explain(ctx, timeout, d)
    elif row.outcome is Outcome.DEATH and death is not None:
        DEATH_RULE.explain(ctx, death, d)
    elif row.outcome is Outcome.HANG and hang is not None:
        if death is not None:
            root = death.data[0]
            ctx.add("rank %d died (%s) after the hang had begun: listed as cascade" % (root.rank, root.cause))
        BY_NAME[hang.rule].explain(ctx, hang, d)
        if hang.start:
            d.details["hang_start_wall_ns"] = hang.start
        note = stall_note(ctx)
        if note:
            ctx.add(note)
        d.cascade = [c for c in fails if c["rank"] not in d.culprit_ranks]
    else:
        found = _ranks_idle_actor(ctx)
        rules = (
            ((BY_NAME[found.rule], found),)
            if found is not None
            else ((r, r.find(ctx)) for r in FALLBACK_RULES)
        )
        for rule, f in rules:
            if f is not None:
                rule.explain(ctx, f, d)
                break
        if found is not None:  # (the ranks are Ray actors waiting for their next call: not the cause)
            d.details["ranks_idle"] = sorted(ctx.views)
    return _finish(ctx, d)


def _window_evidence(ctx: Ctx, d: Diagnosis) -> None:
    """``details['window']`` and one evidence line: what moved in the live snapshot's window."""
    w = ctx.window
    assert w is not None
    d.details["window"] = {
        "window_s": w.window_s,
        "advanced_ranks": list(ctx.advanced),
        "advanced_processes": ctx.advanced_processes,
    }
    if ctx.unread_in_window:
        d.details["window"]["unread_processes"] = list(ctx.unread_in_window)
        ctx.add(
            "the ring files of %d process(es) (%s) could not be read at the window's second reading "
            "(deleted during the dump: the run directory removed?): the window cannot show the job "
            "hung, only the stall threshold (%.0f s) can"
            % (len(ctx.unread_in_window), ", ".join(ctx.unread_in_window[:8]), ctx.stall_s)
        )
    if ctx.advanced_in_window:
        others = ctx.advanced_processes - len(ctx.advanced)
        ctx.add(
            "in the %.1f s between two readings of the ring headers and torch's collective counters, %s "
            "made progress: the job is not hung, whatever one instant shows"
            % (
                w.window_s,
                ", ".join(
                    x
                    for x in (
                        "rank%s %s"
                        % ("s" if len(ctx.advanced) > 1 else "", format_ranks(list(ctx.advanced), 8))
                        if ctx.advanced
                        else "",
                        "%d other process%s" % (others, "es" if others > 1 else "") if others else "",
                    )
                    if x
                ),
            )
        )
    elif not ctx.unread_in_window:
        ctx.add(
            "no traced process made progress in the %.1f s between two readings of the ring headers and "
            "torch's collective counters" % w.window_s
        )


def _ranks_idle_actor(ctx: Ctx) -> Optional[Finding]:
    """Nothing progressed for the stall threshold, no rank waits in a collective, and a
    rank-less Ray actor is the end of the driver's waits or stuck in a method (the rules
    for jobs without ranks, ``_rankless``), while every rank is a Ray actor inside no
    method, or inside one that waits on a Ray call (``actorgraph.open_waits``: a link of
    the chain): that actor is the verdict - the ranked actors idle between steps are waiting
    for it too (a rollout actor that never returns while
    the trainer actors, ranks 0..N, wait for their next call). Found on a job written from
    an RL incident (2026-12-04): the verdict was "Unknown: nothing progressed but no rank
    is in a collective"; blind helper 55 the same when trainer 0's weight sync waited in
    ``ray.get`` on the rollout actor's ``update_weights``."""
    if ctx.inst_of or not ctx.stalled:
        return None
    if not all(
        (v.proc.meta or {}).get("ray_actor_id") and (v.proc.phase is None or open_waits(v.proc))
        for v in ctx.views.values()
    ):
        return (
            None  # a rank inside a method doing its own work (its rendezvous), or not a Ray actor: not idle
        )
    return _rankless(ctx)


def _rankless(ctx: Ctx) -> Optional[Finding]:
    """No rank at all: an actor's failure (rule ``actors``) first, then ``ACTOR_RULES`` in
    order (actor-call cycle or chain end, unschedulable actor), then the stuck actors."""
    found = ACTORS.find(ctx)
    if found is not None and found.data[0] == "failed":
        return found
    return next((f for f in (rule.find(ctx) for rule in ACTOR_RULES) if f is not None), found)


def _finish(ctx: Ctx, d: Diagnosis) -> Diagnosis:
    straggler_details(ctx, d)  # issue 43: a rank every recent step waits for (never the verdict)
    from hangtrace.tracer.analyze.nodes import node_details

    explain_split(ctx, d)  # ranks that created their process groups in another order (groupdefs.py)
    enrich.ray_details(ctx, d)  # issue 4
    enrich.rankless_actor_failures(ctx, d)  # issue 9: actors without a rank beside the ranks
    enrich.memory_details(ctx, d)  # issue 5
    enrich.memory_monitor_holders(ctx, d)  # issue 9: who held the memory Ray's monitor freed
    enrich.thread_and_stack_notes(ctx, d)
    loader_workers(ctx, d)  # a culprit waiting for a DataLoader batch: what its workers do
    child_process(ctx, d)  # a culprit waiting for a child process: which child, doing what
    lock_waits(ctx, d)  # a culprit waiting for a lock while other threads of it do too
    peer_waits(ctx, d)  # a culprit blocked on a local socket: the process at the other end, doing what
    poll_waits(ctx, d)  # culprits polling for a condition: where their waiters are, and a cycle
    replacement(ctx, d)  # a culprit rank restarted alone: what its new process does
    node_details(ctx, d)  # issue 39: the culprits' nodes, the nodes not seen
    if d.culprit_ranks and d.waiting_ranks:
        cs = set(d.culprit_ranks)
        d.waiting_ranks = [r for r in d.waiting_ranks if r not in cs]
    seen = frameworks_seen(ctx.envs)  # issue 37: which framework and version, tested or not
    if seen:
        d.details["frameworks"] = seen
        ctx.evidence.insert(min(len(ctx.evidence), MAX_EVIDENCE - 2), framework_line(seen))
    ev = ctx.evidence
    if len(ev) > MAX_EVIDENCE:
        ev = ev[: MAX_EVIDENCE - 1] + ["... %d more evidence lines" % (len(ev) - MAX_EVIDENCE + 1)]
    d.evidence = ev
    from hangtrace.tracer.report.paragraph import verdict_paragraph

    d.summary = verdict_paragraph(d)
    return d
