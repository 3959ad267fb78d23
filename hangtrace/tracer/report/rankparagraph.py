"""The opening sentences of the verdicts about a rank's own state and of those without a
culprit (pure): stuck outside collectives (at exit, waiting for a child), dead rank,
transport error, progressing, unknown. A ``Diagnosis``, the culprit ranks' text ``who``,
the collective's text ``coll`` and ``diag.details`` in; the sentences out. Split from
``paragraph.py``, which composes them."""

import re
from typing import Any, Dict, List

from hangtrace.tracer.analyze.failures.attempts import last_line
from hangtrace.tracer.analyze.failures.exceptions import short_error
from hangtrace.tracer.report.stragglertext import straggler_phrase, straggler_sentence
from hangtrace.tracer.diagnosis import LOOP_IDLE, Cause, Diagnosis, blocked_on
from hangtrace.tracer.report.clip import clip
from hangtrace.tracer.report.phrases import (
    doing as _doing,
    reason as _reason,
    where as _where,
)
from hangtrace.tracer.report.rayparagraph import actor_dead, actor_stuck, call as _call
from hangtrace.tracer.report.words import ranks_text as _ranks, verb as _verb


def _waiters_text(diag: Diagnosis, coll: str) -> str:
    d = diag.details or {}
    direct = d.get("direct_waiters") or diag.waiting_ranks
    it = "them" if len(diag.culprit_ranks) > 1 else "it"
    s = "%s %s for %s in %s%s" % (
        _ranks(direct),
        _verb(direct),
        it,
        coll,
        ", at %s" % d["waiter_at"] if d.get("waiter_at") else "",
    )  # analyze/stuck/pollwait.py
    extra = [r for r in diag.waiting_ranks if r not in set(direct)]
    if extra:
        s += " (%s %s for %s through a chain of collectives)" % (_ranks(extra), _verb(extra), it)
    return (
        s
        + "."
        + (" %s." % (d["poll_cycle"][:1].upper() + d["poll_cycle"][1:]) if d.get("poll_cycle") else "")
    )


def _exit_wait(diag: Diagnosis, d: Dict[str, Any]) -> str:
    """A verdict of rules/exit_wait.py in (the program returned, the process does not exit); its sentence out."""
    texts = [
        "rank %s%s" % (r, "'s " + t[4:] if t.startswith("its ") else ": " + t)
        for r, t in list(d["exit_wait"].items())[:3]
    ]
    ex = d.get("exited_ranks") or []
    return "Stuck at exit (in no collective)%s: %s.%s" % (
        _where(diag).replace(" at ", ", after ", 1),
        "; ".join(texts),
        " %s exited cleanly." % _ranks(ex).capitalize() if ex else "",
    )


def _child_reason(d: Dict[str, Any]) -> str:
    """The details of analyze/stuck/childwait.py in; the reason 'it waits for its child process (…)' out."""
    # the child's sentence says what the wait is about: the parent's own pipes or wait4
    # and the subprocess module's frames only repeat it; where the user's code called it stays
    user, rest = d.get("child_wait_at"), str(d.get("child_wait_children") or "")
    return "it waits for %s child process (%s%s)%s" % (
        "a" if rest.startswith(";") else "its",
        d["child_wait_how"],
        ", called at %s" % user if user else "",
        rest,
    )


def _stuck_after(d: Dict[str, Any], child: bool) -> str:
    """The details in; the sentences after the reason (the exception it stopped after, what it
    waits on, the rank that timed out waiting for it) out, '' or each starting with a space."""
    after = (" It stopped after an exception: %s." % d["after_exception"]) if d.get("after_exception") else ""
    after += "".join(
        " %s." % (d[k][:1].upper() + d[k][1:])
        for k in ("loader_wait", "child_wait", "lock_wait", "peer_wait")
        if d.get(k) and not (k == "child_wait" and child)
    )
    to = d.get("timed_out")
    if to:  # rules/timeout_waiter.py: the rank that gave up waiting for it
        many = [r for r in to.get("ranks") or () if r != to.get("rank")]
        after += " %s gave up waiting for it in a collective%s: %s." % (
            _ranks([to.get("rank")] + many).capitalize(),
            " (rank %s first)" % to.get("rank") if many else "",
            clip(str(to.get("text")), 160),
        )
    return after


def _stuck_waiters(diag: Diagnosis, coll: str, d: Dict[str, Any]) -> str:
    """The diagnosis in; the sentence on who waits for the stuck rank(s) and where ('' if none) out."""
    if d.get("rendezvous_ranks") and diag.waiting_ranks and not coll:  # rules/before_rendezvous.py
        return "%s %s for %s in init_process_group (the rendezvous).%s" % (
            _ranks(diag.waiting_ranks),
            _verb(diag.waiting_ranks),
            "it" if len(diag.culprit_ranks) == 1 else "them",
            " %s." % (d["rendezvous_lock"][:1].upper() + d["rendezvous_lock"][1:])
            if d.get("rendezvous_lock")
            else "",
        )
    return (
        _waiters_text(diag, coll)
        if diag.waiting_ranks and coll
        else ("Others wait for it in %s." % coll if coll else "")
    )


def _said(reason: str, place: Dict[str, Any]) -> str:
    """``reason`` without its ' in FRAME' where the place said first names that frame and
    nothing of the reason's follows it (' in f (x.py:1): `code`' stays)."""
    for label in (place.get("inner"), place.get("call"), place.get("user")):
        if label:
            reason = re.sub(r" in %s(?=$|;| \()" % re.escape(str(label)), "", reason, count=1)
    return reason


def stuck_text(diag: Diagnosis, who: str, coll: str, d: Dict[str, Any]) -> str:
    """The sentences of a rank (or Ray actor) stuck outside collectives."""
    if not diag.culprit_ranks and diag.culprit_actors:  # rules/actors.py, actor_waits.py
        return actor_stuck(diag, d)
    if d.get("exit_wait"):  # rules/exit_wait.py: the program returned, the process does not exit
        return _exit_wait(diag, d)
    reason, doing = _reason(diag), _doing(diag)
    reason = blocked_on(reason) or reason  # (the sentence says "not in any collective" already)
    if doing:  # (the place, said first, names these frames already)
        reason = _said(reason, d.get("place") or {})
    if reason.startswith(LOOP_IDLE):  # (its stack is the loop's own frames: the await chain said where)
        doing = ""
    child = len(diag.culprit_ranks) == 1 and d.get("child_wait_how") is not None  # analyze/stuck/childwait.py
    if child:
        reason, doing = _child_reason(d), ""
    after = _stuck_after(d, child)
    waiters = _stuck_waiters(diag, coll, d)
    # (issue 41: where it is, user-first, before why: its own line and the call it made)
    return "Stuck outside collectives: %s %s not in any collective%s%s: %s.%s %s" % (
        who,
        "are" if len(diag.culprit_ranks) > 1 else "is",
        _where(diag),
        doing,
        reason or "it made no progress",
        after,
        waiters[:1].upper() + waiters[1:],
    )


def _at_coll(coll: str, d: Dict[str, Any]) -> str:
    """Where a dead rank stopped: in or after the verdict's collective, or before it when
    its own last on that group is an earlier seq (``details['root_last_seq']``)."""
    if not coll:
        return ""
    if d.get("root_last_seq") is not None:
        return " before %s (its last there: seq %s)" % (coll, d["root_last_seq"])
    return " during/after %s" % coll


def dead_text(diag: Diagnosis, who: str, coll: str, d: Dict[str, Any]) -> str:
    """The sentences of a dead rank (or Ray actor): its cause, restarts, teardown and cascade."""
    text = d.get("cause_text") or ""
    casc = diag.cascade or []
    if not diag.culprit_ranks and diag.culprit_actors:  # rules/actors.py: Ray actors without a rank
        return actor_dead(diag, d)
    if (
        "Original Traceback" in text
    ):  # an exception re-raised from a DataLoader worker: its own last line says it
        head = text.split("Original Traceback", 1)[0].strip().rstrip(".").split(": ", 1)[-1]
        text = "%s (%s)" % (last_line(text), head[:1].lower() + head[1:]) if last_line(text) else text
    td = d.get("teardown") or {}  # (it raised; SIGTERMs came after: analyze/failures/teardown.py)
    s = "Dead rank: %s %s first (cause: %s%s)%s%s%s." % (
        who,
        "failed" if td else "died",
        diag.cause,
        (": " + text) if text else "",
        _where(diag),
        _at_coll(coll, d),
        _doing(diag),
    )
    att = d.get("attempts") or {}
    if att.get("count", 0) > 1:  # analyze/failures/attempts.py: a restarted rank
        same = att.get("same", 1)
        s += " It ran in %d attempts (restarts); %s." % (
            att["count"],
            "each ended the same way"
            if same == att["count"]
            else "the earlier ones ended otherwise (the evidence says how)"
            if same == 1
            else "%d of them ended the same way" % same,
        )
    s += " %s." % td["text"] if td else ""
    rest = [c for c in casc if c["rank"] not in td.get("ranks", ())]
    if rest:
        eg = cascade_example(rest)
        s += " %d other rank(s) failed after it (cascade, e.g. rank %d: %s)." % (
            len(rest),
            eg["rank"],
            clip(short_error(eg.get("text")) or eg.get("cause") or "", 100),
        )
    elif diag.waiting_ranks and not casc:
        s += " %s %s for it." % (_ranks(diag.waiting_ranks), _verb(diag.waiting_ranks))
    return s


#: cascade failures this close to the first one (ns) are one event (a launcher's SIGTERM to
#: every rank lands in the order the kernel schedules them)
CASCADE_TIE_NS = 1_000_000_000


def cascade_example(rest: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The cascade entry a verdict names (``Diagnosis.cascade``, in time order): the lowest
    rank among those with the first one's cause within :data:`CASCADE_TIE_NS` of it, so that
    two snapshots of one incident name the same rank (issue 38)."""
    first = rest[0]
    t0 = first.get("wall_ns") or 0
    ties = [
        c
        for c in rest
        if c.get("cause") == first.get("cause") and abs((c.get("wall_ns") or 0) - t0) <= CASCADE_TIE_NS
    ]
    return min(ties, key=lambda c: c["rank"])


def transport_text(diag: Diagnosis, who: str, coll: str, d: Dict[str, Any]) -> str:
    """The sentence of a transport error with no rank dead."""
    s = "Transport error: %s failed first in %s with '%s', and no rank is dead%s." % (
        who,
        coll or "a collective",
        clip(d.get("cause_text") or "", 160),
        _where(diag),
    )
    if diag.cascade:
        s += " %d more rank(s) failed after it." % len(diag.cascade)
    return s


def progressing_text(diag: Diagnosis, who: str, coll: str, d: Dict[str, Any]) -> str:
    """The sentence of a run that is progressing (no verdict); with a straggler (issue 43):
    ``Progressing; rank 2 is slow: +30 ms per step (+75 %), in phase 'train', since step 20.``"""
    age = d.get("last_progress_age_s")
    st = d.get("straggler")
    unread = (d.get("window") or {}).get("unread_processes")
    if unread:  # (analyze/diagnose._window_evidence)
        return (
            "Not judged over a window: the ring files of %d process(es) vanished during the dump's "
            "window (the run directory deleted?), and the job is not past the stall threshold%s."
            % (len(unread), "; last progress %.1f s before the snapshot" % age if age is not None else "")
        )
    if st:
        return "Progressing; %s. %s" % (straggler_phrase(st), straggler_sentence(st))
    return "Progressing: no rank waits for a missing or diverged rank%s." % (
        "; last progress %.1f s before the snapshot" % age if age is not None else ""
    )


_UNKNOWN_WHY = {
    Cause.NO_DATA.value: "no traced process with a rank in the snapshot",  # unknown: why, per cause
    Cause.NO_RECORD_FILE.value: "the ranks everyone waits for left no record file",
    Cause.STALLED_INSIDE_COLLECTIVE.value: "every member entered the collective and it does not complete",
    Cause.STALLED_OUTSIDE_COLLECTIVES.value: "nothing progressed but no rank is in a collective",
    Cause.STALLED_IN_RENDEZVOUS.value: "the ranks are stuck in the rendezvous (every rank is inside "
    "init_process_group; no process group was created)",
}


def unknown_text(diag: Diagnosis, who: str, coll: str, d: Dict[str, Any]) -> str:
    """The sentence of an unknown verdict: why not known, per cause, and the suspects."""
    inc = d.get("actor_chain_incomplete")
    if inc:  # rules/actor_waits.py: a chain of actor calls ends at an idle actor
        return (
            "Unknown: a chain of actor calls waits on Ray actor %s (%s), which is inside no method and never "
            "started %s: the wait that holds the chain is not recorded, so no actor is named. The chain: %s."
            % (
                inc.get("actor"),
                ", ".join(inc.get("methods") or ["?"]),
                "it" if len(inc.get("methods") or []) < 2 else "them",
                "; ".join(_call(x) for x in (d.get("actor_chain") or [])[:6]),
            )
        )
    why = _UNKNOWN_WHY.get(
        str(diag.cause) if diag.cause else "", str(diag.cause) if diag.cause else "not enough data"
    )
    rd = d.get("rankless_death")  # a launcher that died before its ranks existed
    s = "Unknown: %s%s" % (
        why,
        "; %s died before any process joined a process group: %s" % (rd["process"], rd["cause_text"])
        if rd
        else "",
    )
    if diag.culprit_ranks:
        s += "; suspects: %s" % who
    if d.get("loader_wait"):  # analyze/stuck/loaderwait.py: every rank waits for its DataLoader
        s += "; %s" % d["loader_wait"]
    return s + (" (%s)" % coll if coll else "") + "."
