"""Deaths: which ranks died, of what, when, and which deaths are victims (pure).

In: a rank's view (``rankview.RankView``: its process's state, exit code, events, signal
dumps, failed record), torchelastic's error file for it, its helper processes; for the
job-level answers the context (``context.Ctx``). Out: the view's death fields filled
(:func:`fill_death`), every failure by time (:func:`failures`), the root deaths
(:func:`roots`), a job stopped after a stall (:func:`stopped_after_stall`). What error
texts and phases mean is ``causes``; a death against a hang's start is ``afterhang``.

A rank is dead when ``state == 'killed'``, or 'exited' with a non-zero exit code, or it
has an 'exception' event (or torchelastic's error file stands for one: ``analyze/failures/elastic.py``). Cause (a :class:`~hangtrace.tracer.diagnosis.Cause` value):
'sigterm' (a SIGTERM dump or exit code -15), 'fatal-signal' (a fatal-error dump, or exit
code -6/-11/-7/-4/-8), 'exception' (type and message in ``cause_text``), 'exit-code N',
else 'killed-without-record' (SIGKILL? host OOM-kill? - no handler ran). A death whose
only reason is a transport error ("Connection closed by peer", "Timed out waiting",
"connection reset", ...) is a *victim*, never the root when a non-victim death exists.
Failure time: exception/signal/exit time, else the failed record's end, else the last sign of
life (last record, progress) - a lower bound for SIGKILL; an exception shortly before a SIGTERM
is the failure (``teardown.py``). Memory evidence (``analyze/memory``, docs/MEMORY.md) then
refines the cause ('host-oom-kill', 'ray-memory-monitor', 'cuda-oom', 'sigterm-external'). Times in ns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Tuple

from hangtrace.tracer.analyze.failures.causes import (
    KILLED,
    STOPPED_WAIT_NS,
    base_cause,
    interrupted_at_work,
    is_transport_error,
    is_transport_exception,
    rec_fail_wall,
)
from hangtrace.tracer.analyze.failures.departures import departure_root, sent_by
from hangtrace.tracer.analyze.failures.teardown import raised_before_sigterm
from hangtrace.tracer.analyze.rankview import RankView, index_process
from hangtrace.tracer.diagnosis import Cause, exit_code_cause
from hangtrace.tracer.snapshot import ProcessInfo, Role

if TYPE_CHECKING:
    from hangtrace.tracer.analyze.context import Ctx
    from hangtrace.tracer.analyze.failures.elastic import ElasticError


_SIGNAL_CAUSES = {
    -15: Cause.SIGTERM.value,
    -6: Cause.FATAL_SIGNAL.value,
    -11: Cause.FATAL_SIGNAL.value,
    -7: Cause.FATAL_SIGNAL.value,
    -4: Cause.FATAL_SIGNAL.value,
    -8: Cause.FATAL_SIGNAL.value,
}

#: "Stopped after a stall": every rank dead within this window (s) ...
STOPPED_WINDOW_S = 30.0
#: ... and each at least this long (s) after its last progress.
STOPPED_GAP_S = 60.0


def _signal_cause(v: RankView, sig: Mapping[str, Any], code: Optional[int], times: List[int]) -> bool:
    """Fill a SIGTERM / fatal-signal cause; False when neither applies."""
    if "sigterm" in sig or code == -15:
        v.cause = Cause.SIGTERM.value
        v.cause_text = (
            "SIGTERM received (faulthandler dump present)%s" % sent_by(sig["sigterm"])
            if "sigterm" in sig
            else "exit code -15"
        )
        times.append((sig.get("sigterm") or {}).get("wall_ns") or 0)
        return True
    if "fatal" in sig or code in _SIGNAL_CAUSES:
        v.cause = Cause.FATAL_SIGNAL.value
        text = (sig.get("fatal") or {}).get("text") or ""
        first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
        v.cause_text = first or "exit code %s" % code
        times.append((sig.get("fatal") or {}).get("wall_ns") or 0)
        return True
    return False


def _killed_text(v: RankView, code: Optional[int]) -> str:
    p = v.proc
    text = (
        "no exit record (SIGKILL, OOM kill, or stopped): the pid vanished without a "
        "clean-exit record or signal dump (a SIGTERM leaves a stacks/sigterm-* "
        "dump only where that folder is kept)"
    )
    if code == -9:
        text = "exit code -9 (SIGKILL; host OOM-kill or an external kill)"
    oom = [k for k, val in (p.meta or {}).items() if "oom" in str(k).lower() and val]
    if oom:
        text += "; meta: %s" % ", ".join("%s=%s" % (k, p.meta[k]) for k in oom)
    return text


def fill_death(
    v: RankView,
    errfile: Optional[ElasticError] = None,
    helpers: Sequence[ProcessInfo] = (),
    stopped: bool = False,
) -> None:
    """Fill v.dead / cause / cause_text / victim / fail_wall from state, events, signals
    (see the module docstring), then refine the cause from memory evidence. ``errfile``:
    torchelastic's error file recorded for this rank (``analyze/failures/elastic.py``), the
    exception where our own records hold none and the process died (or wrote it itself);
    ``helpers``: the rank's helper processes (its DataLoader workers, for memory evidence);
    ``stopped``: its SIGTERM killed it although it was idle (``teardown.stopped_idle_actors``)."""
    p = v.proc
    dead, exc, from_file = _death(v, errfile, stopped)
    if not dead:
        return
    v.dead = True
    times: List[int] = []
    _set_cause(v, exc, errfile if from_file else None, times)
    raised_before_sigterm(v, times)  # it raised, then was SIGTERMed: the exception is its failure
    if v.failed is not None:
        times.append(rec_fail_wall(v.failed))
    if p.exit_wall_ns:
        times.append(p.exit_wall_ns)
    times = [t for t in times if t]
    v.fail_wall = min(times) if times else v.last_wall
    if sigterm_in_long_wait(v):
        # SIGTERMed while waiting long in a collective (e.g. the user stopped a hung job):
        # a victim of the hang, not its root (``Ctx`` withdraws it when the other members
        # completed that collective: ``sigterm_wait_completed``)
        v.victim = True
    _memory_cause(v, helpers)  # issue 5: host OOM-kill, Ray memory monitor, CUDA OOM, external SIGTERM


def _death(
    v: RankView, errfile: Optional[ElasticError], stopped: bool = False
) -> Tuple[bool, Optional[Dict[str, Any]], bool]:
    """Whether ``v``'s process died (state, exit code, exception, signal dumps, ``errfile``):
    ``(dead, the exception event or None, whether that exception is the error file's)``."""
    p = v.proc
    exc: Optional[Dict[str, Any]] = p.exception
    code: Optional[int] = p.exit_code
    sigs: Mapping[str, Any] = p.signals or {}
    # issue 9: a SIGTERM or fatal-signal dump decides, whatever the exit code: Ray turns
    # SIGTERM into its own graceful exit (code 0 or 1) - the founding report's "Worker
    # exits with an exit code 1 ... The process receives a SIGTERM". Only while it was at
    # work (in a collective or a phase, or a phase the stop itself unwound:
    # ``interrupted_at_work``): an idle worker SIGTERMed by ``ray.shutdown()`` at
    # the end of a clean run did not die of it
    # A process still alive with a SIGTERM dump is being stopped (Ray's handler exits it
    # gracefully, which takes a while): it dies at its SIGTERM's time, so a peer killed by
    # the job's shutdown 56 ms later is not taken for the first death (blind job
    # ray_trainer_sigterm, RESULTS.md 23:40)
    stopping = p.state == "alive" and "sigterm" in sigs
    signalled = (
        (p.state in ("exited", "killed") and ("sigterm" in sigs or "fatal" in sigs)) or stopping
    ) and (stopped or v.blocked is not None or p.phase is not None or interrupted_at_work(p))
    dead = (
        p.state == "killed" or (p.state == "exited" and code not in (0, None)) or exc is not None or signalled
    )
    from_file = exc is None and errfile is not None and (dead or errfile.pid == p.pid)
    if from_file and errfile is not None:
        exc, dead = errfile.event(), True
    return dead, exc, from_file


def _set_cause(
    v: RankView, exc: Optional[Dict[str, Any]], errfile: Optional[ElasticError], times: List[int]
) -> None:
    """Set dead ``v``'s cause, cause_text and victim from its signals, its exception ``exc``
    (``errfile``: the error file it came from, or None), its exit code; failure times go to ``times``."""
    p = v.proc
    code: Optional[int] = p.exit_code
    if _signal_cause(v, p.signals or {}, code, times):
        # SIGTERMed after a collective of its own had failed with a transport error (a peer
        # died; the launcher then tore the job down, as torchrun does): a victim
        v.victim = v.cause == Cause.SIGTERM.value and bool(
            v.failed and is_transport_error(v.failed.get("error"))
        )
    elif exc is not None:
        v.cause = Cause.EXCEPTION.value
        v.cause_text = "%s: %s" % (exc.get("type") or "Exception", (exc.get("message") or "").strip())
        if errfile is not None:
            v.cause_text = errfile.text()
        v.victim = is_transport_exception(exc.get("type"), exc.get("message"), exc.get("traceback"))
        times.append(exc.get("wall_ns") or 0)
    elif p.state == "exited" and code is not None:
        v.cause = exit_code_cause(code)
        v.cause_text = "exited with code %d" % code
        v.victim = bool(v.failed and is_transport_error(v.failed.get("error")))
    else:
        v.cause = KILLED
        v.cause_text = _killed_text(v, code)


def sigterm_in_long_wait(v: RankView) -> bool:
    """True when dead rank ``v`` received its SIGTERM while waiting in a collective it had
    been waiting in for at least ``STOPPED_WAIT_NS``. A shorter wait is an ordinary step
    (a peer a little slower): a SIGTERM then - a scheduler's preemption, a user's kill of
    one rank - is the root, not a victim of a hang (CI, 2026-12-01: rank 1 SIGTERMed
    0.2 s into an all_reduce whose peer was slow was called a victim and the verdict
    became 'sequence diverged')."""
    b = v.blocked
    if v.cause != Cause.SIGTERM.value or b is None or not v.fail_wall:
        return False
    start = int(b.get("t_wall_ns") or 0)
    return bool(start) and v.fail_wall - start >= STOPPED_WAIT_NS


def sigterm_wait_completed(ctx: Ctx, v: RankView) -> bool:
    """True when every other traced member of the group ``v`` was SIGTERMed in already
    passed that collective (their newest seq on the group is higher): it was not hung,
    so the SIGTERM is no victim of a hang."""
    b = v.blocked
    if b is None:
        return False
    g, s = b.get("group"), int(b.get("seq") or 0)
    others = [m for m in ctx.members(g) if m != v.rank and m in ctx.views]
    return bool(others) and all(int((ctx.views[m].last.get(g) or {}).get("seq") or 0) > s for m in others)


def _memory_cause(v: RankView, helpers: Sequence[ProcessInfo] = ()) -> None:
    """Refine ``v.cause`` from memory evidence (analyze/memory); keeps the cause when the
    evidence supports no other. Never raises."""
    try:
        from hangtrace.tracer.analyze.memory import attribute

        att = attribute(v.proc, v.cause, v.cause_text, helpers=helpers)
    except Exception as e:  # a bug here must not cost the verdict
        v.mem = {"base_cause": v.cause, "evidence": ["memory attribution failed: %r" % (e,)]}
        return
    v.mem = att
    if att["cause"] != v.cause:
        v.cause, v.cause_text = att["cause"], att["cause_text"]


def failures(ctx: Ctx) -> List[Dict[str, Any]]:
    """Every failure: dead ranks and ranks with a failed collective/p2p record, by time.

    Items: ``{'rank', 'cause', 'wall_ns', 'text', 'victim'}`` (+ ``group, seq, op`` for a
    failed record) - the ``cascade`` items of docs/DIAGNOSIS.md."""
    out: List[Dict[str, Any]] = []
    for r, v in ctx.views.items():
        if v.dead:
            out.append(
                {
                    "rank": r,
                    "cause": v.cause,
                    "wall_ns": v.fail_wall,
                    "text": v.cause_text,
                    "victim": v.victim,
                }
            )
        elif v.failed is not None:
            err = v.failed.get("error") or ""
            out.append(
                {
                    "rank": r,
                    "cause": Cause.TRANSPORT_ERROR.value if is_transport_error(err) else "collective-failed",
                    "wall_ns": rec_fail_wall(v.failed),
                    "text": err[:300],
                    "victim": is_transport_error(err),
                    "group": v.failed.get("group"),
                    "seq": v.failed.get("seq"),
                    "op": v.failed.get("op"),
                }
            )
    out.sort(key=lambda c: (c["wall_ns"] or 0, c["rank"]))
    return out


def roots(ctx: Ctx) -> List[RankView]:
    """Non-victim deaths, earliest failure first (ties: lower rank), after the rank that left
    first when that explains the failures (``analyze/failures/departures.py``: ``departed``, not dead).
    A transport failure is a victim of a peer's death; but when it is the first failure of
    all, raised as the rank's exception, and every other death is a SIGTERM after it (the
    launcher tearing the job down), no death explains it: it is the root (blind helper 68:
    after a torchrun restart rank 0's init_process_group failed with "Gloo connectFullMesh
    failed ... Connection refused", and the verdict blamed rank 1's SIGTERM from torchrun)."""
    key = lambda v: (v.fail_wall or 0, v.rank)  # noqa: E731
    out = sorted((v for v in ctx.views.values() if v.dead and not v.victim), key=key)
    dead = sorted((v for v in ctx.views.values() if v.dead), key=key)
    left = departure_root(ctx, out, failures(ctx))
    if left is not None:  # a rank left first; the failures are its peers' connections closing
        return [left] + out
    if (
        out
        and dead
        and dead[0].victim
        and base_cause(dead[0]) == Cause.EXCEPTION.value
        and (dead[0].fail_wall or 0) < (out[0].fail_wall or 0)
        and all(base_cause(v) == Cause.SIGTERM.value for v in out)
    ):
        return [dead[0]] + out
    return out


def stopped_after_stall(ctx: Ctx) -> Optional[Tuple[float, float, Dict[int, bool]]]:
    """``(spread_s, min_gap_s, {rank: victim})`` when every rank died without an exception
    or exit code (killed without record / SIGTERM) within STOPPED_WINDOW_S of each other,
    each at least STOPPED_GAP_S after its last progress (its records show it alive: memory
    samples, progress stamps, dumps); else None."""
    vs = list(ctx.views.values())
    if len(vs) < 2 or not all(v.dead for v in vs):
        return None
    alive_at: List[int] = []
    gaps: List[float] = []
    for v in vs:
        if base_cause(v) not in (KILLED, Cause.SIGTERM.value):
            return None
        sm = v.proc.summary
        prog = ((sm.last_progress if sm is not None else None) or {}).get("t_wall_ns") or 0
        seen = max(
            [v.last_wall or 0, v.proc.exit_wall_ns or 0]
            + [(x or {}).get("wall_ns") or 0 for x in (v.proc.signals or {}).values()]
        )
        if not prog or not seen:
            return None
        alive_at.append(seen)
        gaps.append((seen - prog) / 1e9)
    spread = (max(alive_at) - min(alive_at)) / 1e9
    if spread > STOPPED_WINDOW_S or min(gaps) < STOPPED_GAP_S or spread > min(gaps) / 2:
        return None
    return spread, min(gaps), {v.rank: v.victim for v in vs}


def first_rankless_death(processes: Any) -> Optional[Tuple[Any, RankView]]:
    """The earliest traced process that died (``fill_death``) when no process has a rank:
    a launcher script that failed before starting its ranks (a missing WORLD_SIZE, a bad
    argument). ``(process, its view)`` or None. Ray actors and task workers are left to the
    actor rules (a Ray driver is a launcher: named here)."""
    from hangtrace.tracer.process_model import ray_role

    best: Optional[Tuple[Any, RankView]] = None
    for p in processes:
        if ray_role(p) in (Role.RAY_ACTOR, Role.RAY_TASK_WORKER):
            continue
        v = index_process(-1, p)
        fill_death(v)
        if v.dead and (best is None or (v.fail_wall or 0) < (best[1].fail_wall or 0)):
            best = (p, v)
    return best
