"""Teardown: the SIGTERMs that end a job after it failed are not its failure (pure).

Ray catches the exception of an actor method (the caller's ``ray.get`` raises
``RayTaskError``) and keeps the actor alive; the driver then calls ``ray.shutdown()`` or
exits, and Ray's raylet SIGTERMs the job's workers (Ray 2.60: the raylet stops the workers of
a job whose driver disconnected). Our SIGTERM stack files name the sender (its pid and
command line, ``hooks/_fastrec.c``). Blind job ``ray_dl_worker_segv`` (2026-12-04): rank 1's
DataLoader worker segfaulted in the dataset's C decoder, rank 1's ``train()`` raised
``RuntimeError: DataLoader worker (pid(s) N) exited unexpectedly``, and 0.33 s later the
raylet SIGTERMed both ranks; the verdict named rank 0, "SIGTERM from the raylet", the root.

* :func:`raised_before_sigterm` (from ``deaths.fill_death``): a rank SIGTERMed at most
  ``causes.STOPPED_WAIT_NS`` after one of its phases (a Ray actor method included:
  ``causes.raised_phases``) raised, or after its exception event, failed there: its cause is
  that exception (a transport error: a victim, as ever) and its failure time the raise; the
  SIGTERM, whoever sent it, is kept in ``RankView.teardown``. A SIGTERM later than that is
  the stop of a stalled job: the exception stays what the hang rules make of it
  (``after_exception``; blind job ``ray_trainer_raise``).
* :func:`mark` (from ``Ctx``): a rank SIGTERMed by Ray itself (:func:`ray_stopper`: the
  raylet, the GCS server, ``ray stop``) after another rank's earlier failure (a death that is
  no victim) is a victim: Ray tearing the job down, never the root; ``RankView.teardown``
  says so. A SIGTERM from Ray with no earlier failure (the memory monitor, ``ray.kill``) keeps
  its meaning. :func:`rankless_teardown`: the same for a Ray actor without a rank (a Rollout
  SIGTERMed by the raylet at ``ray.shutdown()`` after a rank failed is no candidate root).
* :func:`stopped_idle_actors` (from ``Ctx``): a Ray actor rank SIGTERMed by someone else
  (:func:`external_sender`: not Ray, not hangtrace) while idle between methods exits with code
  0 by Ray's handler; when the job went on after that SIGTERM (another rank progressed), it
  died there (Ray reports it dead; issue 38).

Times are ns since the epoch.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Tuple

from hangtrace.tracer.analyze.failures.causes import (
    STOPPED_WAIT_NS,
    base_cause,
    is_stop_error,
    is_transport_raise,
    raised_phases,
)
from hangtrace.tracer.analyze.failures.departures import sent_by
from hangtrace.tracer.analyze.stuck.stacktree import format_ranks
from hangtrace.tracer.diagnosis import Cause

if TYPE_CHECKING:
    from hangtrace.tracer.analyze.context import Ctx
    from hangtrace.tracer.analyze.rankview import RankView

#: Executables (basename of argv[0]) of Ray's own processes that stop workers.
RAY_STOPPERS = ("raylet", "gcs_server")
_SIGTERMS = (Cause.SIGTERM.value, Cause.SIGTERM_EXTERNAL.value)


def sigterm_wall(v: RankView) -> int:
    """When rank ``v`` received its SIGTERM (its dump's time, else its exit's), 0 if unknown."""
    sig = (v.proc.signals or {}).get("sigterm") or {}
    return int(sig.get("wall_ns") or v.proc.exit_wall_ns or 0)


def ray_stopper(sig: Optional[Mapping[str, Any]]) -> str:
    """``"Ray's raylet (pid 5400)"`` when the SIGTERM dump ``sig`` names one of Ray's own
    processes as its sender (``RAY_STOPPERS``, or the ``ray stop`` command), else ''."""
    snd = (sig or {}).get("sender") or {}
    argv = str(snd.get("cmdline") or "").split()
    if not argv:
        return ""
    exe = os.path.basename(argv[0])
    if exe in RAY_STOPPERS:
        return "Ray's %s (pid %s)" % (exe, snd.get("pid"))
    if "stop" in argv[1:3] and any(os.path.basename(a) == "ray" for a in argv[:2]):
        return "`ray stop` (pid %s)" % snd.get("pid")
    return ""


def _first_raise(v: RankView, start: int, end: int) -> Optional[Tuple[int, str]]:
    """The earliest exception of ``v`` raised in ``[start, end]``: ``(wall ns, 'Type: message')``."""
    out: List[Tuple[int, str]] = [(t, text) for t, _name, text, _step in raised_phases(v.proc)]
    exc = v.proc.exception
    if exc is not None:
        text = "%s: %s" % (exc.get("type") or "Exception", (exc.get("message") or "").strip())
        out.append((int(exc.get("wall_ns") or 0), text))
    return min(((t, x) for t, x in out if start <= t <= end and not is_stop_error(x)), default=None)


def raised_before_sigterm(v: RankView, times: List[int]) -> None:
    """When SIGTERMed rank ``v`` (cause ``sigterm``) had raised at most ``STOPPED_WAIT_NS``
    before its SIGTERM, make that exception its cause and add its time to ``times`` (the
    failure times ``fill_death`` takes the earliest of); ``v.teardown`` keeps the SIGTERM."""
    t_sig = sigterm_wall(v)
    if v.cause != Cause.SIGTERM.value or not t_sig:
        return
    first = _first_raise(v, t_sig - STOPPED_WAIT_NS, t_sig)
    if first is None:
        return
    t, text = first
    sig = (v.proc.signals or {}).get("sigterm")
    v.teardown = "it received SIGTERM%s %.2f s after it raised" % (
        sent_by(sig) if sig else "",
        (t_sig - t) / 1e9,
    )
    v.cause, v.cause_text = Cause.EXCEPTION.value, text
    v.victim = is_transport_raise(text)
    times.append(t)


def _own_tool(argv: List[str]) -> bool:
    """True when ``argv`` (a sender's command line) is hangtrace's own CLI (``hangtrace run``
    stopping a job), by the console script's name or ``-m hangtrace``."""
    if any(os.path.basename(a) == "hangtrace" for a in argv[:2]):
        return True
    return any(a == "-m" and b.split(".")[0] == "hangtrace" for a, b in zip(argv, argv[1:]))


def external_sender(sig: Optional[Mapping[str, Any]]) -> bool:
    """True when the SIGTERM dump ``sig`` names its sender (pid) and that is neither one of
    Ray's own processes (:func:`ray_stopper`) nor hangtrace's own CLI: a user, a driver's
    ``os.kill``, a scheduler's preemption."""
    snd = (sig or {}).get("sender") or {}
    return (
        bool(snd.get("pid")) and not ray_stopper(sig) and not _own_tool(str(snd.get("cmdline") or "").split())
    )


def stopped_idle_actors(ctx: Ctx) -> List[RankView]:
    """Ray actor ranks that ``fill_death`` left alive although an external sender
    (:func:`external_sender`) SIGTERMed and whose process then ended (or wrote its exit record:
    a Ray worker's native teardown outlives it, so the pid may still be alive), while the job
    went on: another rank progressed or entered a collective after that SIGTERM. Ray's
    SIGTERM handler exits an actor idle between methods with code 0, yet Ray reports it dead
    (``ActorDiedError``, "The process receives a SIGTERM") and its peers and callers fail:
    its death, at its SIGTERM (issue 38: trainer rank 1 SIGTERMed from outside between two
    ``train`` calls was left alive and Ray's teardown SIGTERMs after it were called the root)."""
    from hangtrace.tracer.process_model import ray_role
    from hangtrace.tracer.snapshot import Role

    out: List[RankView] = []
    for v in ctx.views.values():
        sig = (v.proc.signals or {}).get("sigterm")
        ended = v.proc.state in ("exited", "killed") or v.proc.exit_code is not None
        if v.dead or not ended or not external_sender(sig):
            continue  # (alive, no exit record: its own handler ended its method and it idles - actorreturn)
        if ray_role(v.proc) != Role.RAY_ACTOR:
            continue
        t = sigterm_wall(v)
        went_on = any(
            max(u.progress_wall, int((u.blocked or {}).get("t_wall_ns") or 0)) > t
            for u in ctx.views.values()
            if u is not v
        )
        if t and went_on:
            out.append(v)
    return out


def mark(ctx: Ctx) -> None:
    """Mark as victims the ranks Ray itself SIGTERMed after another rank's earlier failure
    (a death that is no victim), with ``teardown``: what happened (module docstring)."""
    stopped: List[Tuple[RankView, str, int]] = []
    for v in ctx.views.values():
        who = ray_stopper((v.proc.signals or {}).get("sigterm"))
        if v.dead and not v.victim and who and base_cause(v) in _SIGTERMS:
            stopped.append((v, who, sigterm_wall(v)))
    ranks = {v.rank for v, _who, _t in stopped}  # (one of them is no earlier failure for another)
    for v, who, t in stopped:
        first = min(
            (
                u
                for u in ctx.views.values()
                if u.dead and not u.victim and u.rank not in ranks and u.fail_wall and u.fail_wall < t
            ),
            key=lambda u: (u.fail_wall, u.rank),
            default=None,
        )
        if first is None:
            continue
        v.victim = True
        v.teardown = (
            "SIGTERM from %s %.2f s after rank %d failed: Ray stopping the job's workers (teardown)"
            % (who, (t - first.fail_wall) / 1e9, first.rank)
        )


def rankless_teardown(ctx: Ctx, v: RankView) -> bool:
    """True when ``v`` (a process without a rank, ``fill_death`` filled) died of a SIGTERM
    from Ray itself (:func:`ray_stopper`) after a rank's failure (a death that is no victim
    and not itself Ray's teardown): Ray stopping the job's workers, a cascade of that failure
    whatever Ray's worker exit type says, never a root (issue 38: a Rollout actor SIGTERMed by
    the raylet at ``ray.shutdown()`` after trainer rank 1's external SIGTERM was named the root)."""
    sig = (v.proc.signals or {}).get("sigterm")
    if not v.dead or base_cause(v) not in _SIGTERMS or not ray_stopper(sig):
        return False
    t = sigterm_wall(v)
    return any(
        u.dead and not u.victim and u.fail_wall and u.fail_wall < t and not _ray_stopped(u)
        for u in ctx.views.values()
    )


def _ray_stopped(u: RankView) -> bool:
    """True when ``u`` died of a SIGTERM Ray itself sent (no earlier failure of its own)."""
    return base_cause(u) in _SIGTERMS and bool(ray_stopper((u.proc.signals or {}).get("sigterm")))


def details(ctx: Ctx, root: RankView) -> Dict[str, Any]:
    """``details['teardown']`` of a dead-rank verdict whose root is ``root``: ``{'text', 'ranks'}``,
    the verdict's words on the SIGTERMs after it failed and the ranks Ray SIGTERMed then
    (``mark``), e.g. "Rank 0 and rank 1 itself then received SIGTERM from Ray's raylet (pid
    5400), 0.32 s later: Ray stopping the job's workers (teardown), not a cause"; {} when
    neither. Adds an evidence line for each."""
    others = sorted(r for r, v in ctx.views.items() if r != root.rank and v.victim and v.teardown)
    for r in [root.rank] + others:
        if ctx.views[r].teardown:
            ctx.add("rank %d: %s" % (r, ctx.views[r].teardown))
    if others:
        first = ctx.views[others[0]]
        self_too = bool(root.teardown) and bool(ray_stopper((root.proc.signals or {}).get("sigterm")))
        text = (
            "%s %s%s then received SIGTERM from %s, %.2f s later: Ray stopping the job's workers (teardown), "
            "not a cause"
            % (
                "Rank" if len(others) == 1 else "Ranks",
                format_ranks(others, 8),
                " and rank %d itself" % root.rank if self_too else "",
                ray_stopper((first.proc.signals or {}).get("sigterm")),
                (sigterm_wall(first) - root.fail_wall) / 1e9,
            )
        )
        return {"text": text, "ranks": others}
    if root.teardown:
        return {
            "text": root.teardown[:1].upper() + root.teardown[1:] + ": the stop of a job that had failed, "
            "not its cause",
            "ranks": [],
        }
    return {}
