"""Chain ends: the ranks reached from the waiting ranks through the wait-for graph that
are not waiting themselves, and what each one is doing (pure).

Following edges from every waiting rank, the ranks reached that are not waiting
themselves and that someone waits for are the *chain ends* (rank A waits in G for B, B
waits in H for C, C is in no collective -> C). Each end with a process is classified:

* dead, and it did not provably live on after the wait began -> 'dead-rank';
* exited cleanly (code 0) -> 'skipped-collective' (it left the loop without it);
* a Ray actor whose method returned after its last collective and which is idle in Ray's
  task loop -> 'skipped-collective' (``actorreturn.py``);
* the thread that issued its collectives has ended while the process lives on (Ray Train's
  ``TrainingThread``; ``threadend.py``) -> 'skipped-collective';
* its stack is inside a torch.distributed call that was not recorded -> skipped (it is
  in some other, untraced collective);
* its main-thread stack top is a blocking non-collective call (queue.get, lock,
  event/condition wait, socket/pipe read, subprocess, future, ray.get, sleep, asyncio
  idle) or py-spy says the thread is idle -> 'stuck-outside-collective';
* it runs (py-spy: its main thread active) outside collectives in a stall, recording
  nothing -> 'stuck-outside-collective', busy (a straggler or a loop that never ends); a
  later step than the waiters' wins over it ('skipped-collective');
* it moved on: recorded activity after the waiters began waiting (a record issued, or
  progress not explained by the completion of its last record), a later step, or another
  phase than the waiters -> 'skipped-collective';
* otherwise (no activity since the others began to wait, stack running or unknown) ->
  'stuck-outside-collective'.

Blocked ranks whose instance misses only members that are *ahead* are *diverged* (their
sequence numbers diverged from the group).
"""

from __future__ import annotations

from dataclasses import dataclass
import os
from typing import Any, Dict, List, Mapping, Set, Tuple

from hangtrace.tracer.analyze.actors.actorreturn import returned_method
from hangtrace.tracer.analyze.context import Ctx
from hangtrace.tracer.analyze.stuck.asynctasks import await_chain, describe as describe_loop
from hangtrace.tracer.analyze.failures.afterhang import death_after
from hangtrace.tracer.analyze.evidence import frames_of
from hangtrace.tracer.stackmodel.usercode import user_frame
from hangtrace.tracer.analyze.stuck.exitwait import exit_wait_text
from hangtrace.tracer.analyze.stuck.threadend import ended_thread
from hangtrace.tracer.analyze.stuck.blocking import blocking_reason, code_text, collective_frame
from hangtrace.tracer.analyze.stuck.stacktree import Frame, _short, format_ranks, frame_label
from hangtrace.tracer.analyze.graph.waitgraph import Inst
from hangtrace.tracer.diagnosis import BLOCKED_OUTSIDE, LOOP_IDLE, Kind

#: (kind value, reason) of one chain end
EndKind = Tuple[str, str]


@dataclass(frozen=True)
class ChainEnds:
    """Chain ends of the wait-for graph. ``present``: ends with a process (sorted);
    ``nofile``: ends without one; ``diverged``: blocked ranks whose instance misses only
    *ahead* members; ``insts_for``: end -> instances that miss it; ``kinds``: end ->
    (kind, reason) for the present ends."""

    present: Tuple[int, ...]
    nofile: Tuple[int, ...]
    diverged: Tuple[int, ...]
    waited: frozenset  # type: ignore[type-arg]
    insts_for: Mapping[int, Tuple[Inst, ...]]
    kinds: Mapping[int, EndKind]


def _reach(ctx: Ctx) -> Tuple[Set[int], Set[int]]:
    reach: Set[int] = set()
    stack = list(ctx.inst_of)
    ends: Set[int] = set()
    while stack:
        r = stack.pop()
        if r in reach:
            continue
        reach.add(r)
        inst = ctx.inst_of.get(r)
        if inst is None:
            ends.add(r)
            continue
        for m in inst.missing:
            if m not in reach:
                stack.append(m)
    return reach, ends


def chain_ends(ctx: Ctx) -> ChainEnds:
    """The chain ends of ``ctx``'s wait-for graph (memoised in ``ctx.cache``)."""
    got = ctx.cache.get("chain_ends")
    if isinstance(got, ChainEnds):
        return got
    reach, ends = _reach(ctx)
    waited: Set[int] = set()
    for inst in ctx.insts.values():
        waited.update(inst.missing)
    ends &= waited
    diverged = [
        r
        for r, i in ctx.inst_of.items()
        if r in reach and not i.missing and i.ahead and (r in waited or not waited)
    ]
    present = sorted(e for e in ends if e in ctx.views)
    # a rank whose collective failed with a transport error (its peer had gone) is a victim:
    # not a culprit while another end explains the wait (blind helper 92: ranks that raised
    # "Connection closed by peer" were called "its program returned without entering it")
    victims = [e for e in present if ctx.views[e].dead and ctx.views[e].victim]
    if victims and len(victims) < len(present):
        present = [e for e in present if e not in victims]
    insts_for: Dict[int, List[Inst]] = {}
    for inst in ctx.insts.values():
        for m in inst.missing:
            if m in ctx.views and m in ends:
                insts_for.setdefault(m, []).append(inst)
    kinds = {e: classify_end(ctx, e, insts_for.get(e, [])) for e in present}
    out = ChainEnds(
        tuple(present),
        tuple(sorted(e for e in ends if e not in ctx.views)),
        tuple(diverged),
        frozenset(waited),
        {k: tuple(v) for k, v in insts_for.items()},
        kinds,
    )
    ctx.cache["chain_ends"] = out
    return out


def classify_end(ctx: Ctx, r: int, insts_for: List[Inst]) -> EndKind:
    """Kind and reason for a chain-end rank ``r`` that others wait for (module docstring)."""
    v = ctx.views[r]
    start = min([i.start for i in insts_for if i.start] or [0])
    later = ""
    if v.dead and not v.victim:
        if not (start and death_after(v, start)):
            return Kind.DEAD_RANK.value, "died: %s" % v.cause_text
        later = " (killed later: %s)" % v.cause
    kind, why = _classify_alive(ctx, r, insts_for, start)
    return kind, why + later


def _waiters_at(ctx: Ctx, insts_for: List[Inst]) -> Tuple[Set[int], Set[str]]:
    """Steps and phases the (first 64 per instance) waiters of ``insts_for`` are in."""
    wsteps: Set[int] = set()
    wphases: Set[str] = set()
    for i in insts_for:
        for w in i.waiters[:64]:
            b = ctx.blocked(w)
            if b.get("step") is not None:
                wsteps.add(b["step"])
            if b.get("phase"):
                wphases.add(b["phase"])
    return wsteps, wphases


def busy_text(ctx: Ctx, v: Any, frames: Any, thread: Any) -> str:
    """``"busy on the CPU outside collectives (py-spy: running) and making no progress for 45 s:
    in pack_sequences (job.py:66): `n = len(seqs[idx])`, inside `while remaining:` (job.py:64)"``
    when the snapshot is a stall and the rank's main thread is running (py-spy's ``active``)
    outside any collective; '' otherwise."""
    if not ctx.stalled or not frames or not isinstance(thread, dict) or thread.get("active") is not True:
        return ""
    f = user_frame(frames) or frames[0]
    idle = (
        (ctx.now - v.progress_wall) / 1e9 if ctx.now and v.progress_wall else 0
    )  # (memory samples are no progress)
    loop = next((x.get("loop") for x in frames[:4] if isinstance(x.get("loop"), (list, tuple))), None)
    return "busy on the CPU outside collectives (py-spy: running) and making no progress%s: in %s%s%s" % (
        " for %.0f s" % idle if idle >= 1 else "",
        frame_label(f),
        code_text(f),
        ", inside `%s` (%s:%s)" % (loop[1], os.path.basename(str(f.get("filename") or "?")), loop[0])
        if loop
        else "",
    )


def _classify_alive(ctx: Ctx, r: int, insts_for: List[Inst], start: int) -> EndKind:
    v = ctx.views[r]
    p = v.proc
    skipped, stuck = Kind.SKIPPED_COLLECTIVE.value, Kind.STUCK_OUTSIDE_COLLECTIVE.value
    if p.state == "exited" and not v.dead:
        return skipped, "exited cleanly (code %s) without entering it" % p.exit_code
    ret = returned_method(ctx, r)  # a Ray actor's method returned: the actor lives on, idle (actorreturn.py)
    if ret is not None:
        return skipped, ret.text()
    gone = ended_thread(p, v.last)  # its loop ran in a thread that ended (analyze/stuck/threadend.py)
    if gone:
        return skipped, "the thread its loop ran in (%s) has ended without entering it" % gone
    labels, frames, thread = frames_of(ctx, r)
    ew = exit_wait_text(p)
    if ew:  # its program returned (analyze/stuck/exitwait.py): it went on without the collective, and hangs at exit
        return skipped, "its program returned without entering it, and %s" % ew.split(" and ", 1)[-1]
    if frames:
        coll = collective_frame(frames)
        if coll:
            return skipped, "its stack is inside %s, a collective hangtrace did not record" % coll
        why = blocking_reason(frames, thread=thread)
        if why:
            if _loop_idle(frames):  # the selector's wait says nothing: the await chain says where it waits
                chain = await_chain(p)
                if chain:
                    return stuck, BLOCKED_OUTSIDE + LOOP_IDLE + chain
            loop = describe_loop(p)  # issue 9: the await chain its event loop is blocked in
            return stuck, "%s%s%s" % (BLOCKED_OUTSIDE, why, "; " + loop if loop else "")
    wsteps, wphases = _waiters_at(ctx, insts_for)
    if v.step is not None and wsteps and v.step > max(wsteps):
        return skipped, "moved on to step %s (waiters are at step %s)" % (v.step, format_ranks(wsteps))
    busy = busy_text(ctx, v, frames, thread)
    if (
        busy
    ):  # running, recording nothing, in a stall: a straggler or a loop that never ends (blind helper 65)
        return stuck, busy
    if start and v.activity_wall > start:
        return skipped, "moved on: recorded activity after the others began waiting"
    if v.phase and wphases and v.phase not in wphases:
        return skipped, "moved on to phase %s (waiters are in %s)" % (v.phase, ", ".join(sorted(wphases)))
    if frames:
        return (
            stuck,
            "not in any collective and no progress since the others began waiting; running %s" % labels[0],
        )
    return stuck, "not in any collective and no progress since the others began waiting (no stack)"


def _loop_idle(frames: List[Frame]) -> bool:
    """An asyncio event loop waiting in its selector for any event: its ``_run_once``
    (asyncio/base_events.py) among the innermost frames."""
    return any(
        _short(f.get("name")) == "_run_once" and str(f.get("filename") or "").endswith("base_events.py")
        for f in frames[:4]
    )
