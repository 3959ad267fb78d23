"""The verdict paragraph a human reads first (pure): which rank(s), group (name, desc, ranks),
seq/op, phase, step, what the culprit does (top frames), why the others wait, what next."""

from typing import Any, Callable, Dict, List, Optional

from hangtrace.tracer.analyze.stuck.stacktree import format_ranks
from hangtrace.tracer.diagnosis import LOOP_IDLE, Cause, Diagnosis, Kind, blocked_on
from hangtrace.tracer.report.advice import next_step
from hangtrace.tracer.analyze.failures.attempts import last_line
from hangtrace.tracer.analyze.failures.exceptions import short_error
from hangtrace.tracer.report.clip import clip
from hangtrace.tracer.report.memorytext import holders_text as _holders_text, memory_text as _memory_text
from hangtrace.tracer.report.rayparagraph import (
    actor_dead,
    actor_deadlock as _actor_deadlock,
    actor_stuck,
    call as _call,
    ray_actor_label,
    ray_text as _ray_text,
    unschedulable as _unschedulable,
)
from hangtrace.tracer.report.words import ranks_text as _ranks, verb as _verb

__all__ = ["verdict_paragraph", "ray_actor_label", "_ranks"]


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


def _group_text(diag: Diagnosis) -> Optional[str]:
    if diag.group is None:
        return None
    d = diag.details or {}
    desc = d.get("group_desc")
    s = "group '%s'" % diag.group
    if desc and desc != diag.group:
        s += " (%s)" % desc
    if diag.group_ranks:
        s += " [ranks %s]" % format_ranks(diag.group_ranks, 8)
    return s


def _where(diag: Diagnosis) -> str:
    parts = []
    if diag.phase:
        parts.append("phase '%s'" % diag.phase)
    if diag.step is not None:
        parts.append("step %s" % diag.step)
    return " at " + ", ".join(parts) if parts else ""


def _sig_where(sig: Dict[str, Any]) -> str:
    """' in phase 'rollout', step 4' for one signature class of a mismatch ('' if unknown)."""
    parts = []
    if sig.get("phase"):
        parts.append("phase '%s'" % sig["phase"])
    if sig.get("step") is not None:
        parts.append("step %s" % sig["step"])
    return " in " + ", ".join(parts) if parts else ""


def _doing(diag: Diagnosis) -> str:
    if not diag.frames:
        return ""
    d, r = diag.details or {}, "rank %d" % diag.culprit_ranks[0] if len(diag.culprit_ranks) > 1 else None
    if d.get("culprit_idle_in"):  # (its call returned: the frames of that loop say nothing; alive or not)
        return "; %s stack shows it back in %s, idle" % (r + "'s" if r else "its", d["culprit_idle_in"])
    user, verb = (
        d.get("user_frame"),
        "raised" if d.get("frames_from") == "traceback" else "is",
    )  # (dead: traceback)
    att = ((d.get("memory") or {}).get("attribution") or {}).get(str(diag.culprit_ranks[0]), {})
    if verb == "raised" and att.get(
        "helper_text"
    ):  # (the worker's death is the news: where the rank noticed it)
        verb = "noticed it and raised"
    gap = " < " if diag.frames[3:4] == [user] else " < ... < "  # (no frame left out: no '...')
    return "; %s %s in %s%s" % (r or "it", verb, " < ".join(diag.frames[:3]), gap + user if user else "")


def _coll(diag: Diagnosis) -> str:
    s = ""
    if diag.op:
        s += diag.op
    if diag.seq is not None:
        s += " seq %s" % diag.seq
    g = _group_text(diag)
    if g:
        s += " on " + g
    return s.strip()


def _what_differs(sigs: List[Dict[str, Any]]) -> str:
    """'issued a different operation than the other members', or what differs for one op."""
    ops = {x.get("op") for x in sigs}
    what = [
        w
        for w, key in (("dtype", "dtype"), ("size", "numel"), ("root or peer", "peer"))
        if len({x.get(key) for x in sigs}) > 1
    ]
    if len(ops) != 1:
        return "issued a different operation than the other members"
    return (
        "issued %s with a different %s than the other members" % (ops.pop(), " and ".join(what))
        if what
        else "issued the same %s as its peer (a p2p pair needs one send and one recv)" % ops.pop()
    )


def _mismatch(diag: Diagnosis, who: str, coll: str, d: Dict[str, Any]) -> str:
    if d.get("group_order"):  # ranks that created their groups in another order (analyze/graph/groupdefs.py)
        return "Collective mismatch: %s." % d["group_order"]["text"]
    if diag.cause == Cause.SEQUENCE_DIVERGED:
        return (
            "Collective mismatch: %s %s in %s, which the other members already passed: the "
            "sequence of collectives on this group diverged%s%s."
            % (who, _verb(diag.culprit_ranks), coll, _where(diag), _doing(diag))
        )
    sigs = d.get("signatures") or []
    # each side's phase/step only when they differ (rank 0 in 'checkpoint' of step 3, the others in step 4)
    differ = len({(x.get("phase"), x.get("step")) for x in sigs}) > 1
    sig_txt = "; ".join(
        "%s: %s%s%s%s"
        % (
            _ranks(x["ranks"]),
            x["op"],
            " %s" % x["dtype"] if x.get("dtype") else "",
            " numel=%s" % x["numel"] if x.get("numel") is not None else "",
            _sig_where(x) if differ else "",
        )
        for x in sigs[:4]
    )
    end = (
        "it completed anyway (gloo does not check that the members agree): the job ran on with wrong data"
        if d.get("silent")
        else "the group cannot complete it"
    )
    pair = d.get("p2p_pair") or []
    if coll and len(pair) == 2 and len({x.get("op") for x in sigs}) == 1 and len(diag.culprit_ranks) == 1:
        # rules/mismatch.py: both sides of a p2p pair posted the same direction; one named by a third rank's op
        r = diag.culprit_ranks[0]
        exp = d.get("p2p_expected")
        return (
            "Collective mismatch (p2p): %s and its peer rank %s both posted %s at %s (a p2p pair needs one send "
            "and one recv: each waits for the other)%s.%s%s; the group cannot complete it."
            % (
                who,
                pair[0] if pair[1] == r else pair[1],
                sigs[0].get("op"),
                coll,
                _where(diag),
                " %s" % (exp[:1].upper() + exp[1:] + ".") if exp else "",
                " Rank %d%s" % (r, _doing(diag)[len("; it") :]) if _doing(diag).startswith("; it ") else "",
            )
        )
    threads = d.get(
        "group_threads_text"
    )  # analyze/graph/threadgroups.py: the culprit's record came from another thread
    sk = d.get(
        "skipped_call"
    )  # analyze/graph/skippedcall.py: a C++-issued collective against a call it never made
    if sk and not threads and sk.get("by_torch") is False:  # its own call: the op the group's stream runs
        threads = (
            "rank %s never called %s: %s %s in it, while rank %s issued %s there, the collective %s issued "
            "just before it: it went on past %s (%s)"
            % (
                sk.get("rank"),
                sk.get("op"),
                _ranks(sk.get("waiters")),
                _verb(sk.get("waiters")),
                sk.get("rank"),
                sk.get("into"),
                _ranks(sk.get("waiters")),
                sk.get("op"),
                "its previous one on this group: seq %s, in step with %s"
                % (sk["last_call"], _ranks(sk.get("waiters")))
                if sk.get("last_call") is not None
                else "its first there, as for %s" % _ranks(sk.get("waiters")),
            )
        )
    elif sk and not threads:
        threads = (
            "rank %s never called %s: %s %s in it (call %s on the group by the program's own count), while "
            "rank %s's last call there was %s (call %s): it went on past it, into a collective torch issued "
            "itself (DDP's gradient all-reduce in backward, or another C++ collective)"
            % (
                sk.get("rank"),
                sk.get("op"),
                _ranks(sk.get("waiters")),
                _verb(sk.get("waiters")),
                sk.get("call"),
                sk.get("rank"),
                sk.get("last_op"),
                sk.get("last_call"),
            )
        )
    if coll:
        return "Collective mismatch: %s %s at %s%s%s%s; %s.%s" % (
            who,
            _what_differs(sigs),
            coll,
            " (%s)" % sig_txt if sig_txt else "",
            _where(diag),
            _doing(diag),
            end,
            " %s." % (threads[:1].upper() + threads[1:]) if threads else "",
        )
    # group/sequence number unknown (e.g. stacks only: hangtrace attach)
    return (
        "Collective mismatch: %s %s blocked in a different collective than the other ranks"
        "%s (group and sequence number unknown)%s%s; they cannot complete it."
        % (
            who,
            "is" if len(diag.culprit_ranks or ()) == 1 else "are",
            " (%s)" % sig_txt if sig_txt else "",
            _where(diag),
            _doing(diag),
        )
    )


def _extra(diag: Diagnosis, who: str, coll: str, ex: Dict[str, Any]) -> str:
    n_c = max((ex.get("culprit_counts") or {}).values() or [0])
    base = ex.get("majority_count")
    more = n_c - base if isinstance(base, int) else 1
    others = ex.get("other_group_ranks") or []
    return (
        "Skipped collective (extra collective): %s issued %s more %s on %s than %s %s%s "
        "(%s vs %s): %s %s in %s%s, which %s never %s%s; the other waits are cascade%s."
        % (
            who,
            "one" if more == 1 else more,
            ex.get("op") or "collective",
            ex.get("group_desc") or coll,
            "its peer" if len(ex.get("peers") or ()) == 1 else "its peers",
            _ranks(ex.get("peers")),
            (" and than the other %s group(s)' %s" % (ex.get("role"), _ranks(others))) if others else "",
            n_c,
            base,
            who,
            _verb(diag.culprit_ranks),
            coll,
            _where(diag),
            _ranks(ex.get("peers")),
            _verb(ex.get("peers"), "issues", "issue"),
            _doing(diag),
            (" (%s %s)" % (_ranks(diag.waiting_ranks), _verb(diag.waiting_ranks)))
            if diag.waiting_ranks
            else "",
        )
    )


def _left(diag: Diagnosis, who: str, coll: str, dep: Dict[str, Any]) -> str:
    """A rank that left first (analyze/failures/departures.py)."""
    waiting = _waiting(diag).strip()
    return "Skipped collective: %s left: %s%s%s.%s%s" % (
        who,
        dep.get("text"),
        ", after %s" % coll if coll else "",
        "; " + str(dep["after"]) if dep.get("after") else "",
        " It %s." % dep["sigterm"] if dep.get("sigterm") else "",
        waiting and " " + waiting[:1].upper() + waiting[1:] + ".",
    )


def _skipped(diag: Diagnosis, who: str, coll: str, d: Dict[str, Any]) -> str:
    if d.get("departed"):
        return _left(diag, who, coll, d["departed"])
    ex = d.get("extra_collective")
    if diag.cause == Cause.EXTRA_COLLECTIVE and ex:
        return _extra(diag, who, coll, ex)
    if diag.cause == Cause.EXTRA_COLLECTIVE:
        failed = d.get("minority_failed")  # rules/minority.py: it failed there and left
        if failed:
            texts = list(failed.values())
            return (
                "Skipped collective: %s alone entered %s%s%s; the other members never call it and "
                "went on, so it could not complete: %s%s."
                % (
                    who,
                    coll,
                    _where(diag),
                    _doing(diag),
                    texts[0],
                    ": the program caught the error" if all("code 0" in t for t in texts) else "",
                )
            )
        return (
            "Skipped collective: %s alone entered %s%s%s; the other members never call it and "
            "went on, so %s %s forever."
            % (who, coll, _where(diag), _doing(diag), who, _verb(diag.culprit_ranks))
        )
    waiting = _waiting(diag).strip()
    return "Skipped collective: %s never reached %s%s: %s%s.%s" % (
        who,
        coll or "the collective the others wait in",
        _where(diag),
        _reason(diag) or "it took another path",
        _doing(diag),
        waiting and " " + waiting[:1].upper() + waiting[1:] + ".",
    )


def _deadlock(diag: Diagnosis, who: str, coll: str, d: Dict[str, Any]) -> str:
    cyc = d.get("cycle") or {}
    groups = ", ".join("'%s'" % g for g in cyc.get("groups", []))
    bo = d.get("broken_order")  # analyze/graph/grouporder.py: a minority broke the order all ranks had kept
    if bo:
        side = bo.get("side") or []
        return (
            "Cross-group deadlock: ranks %s wait on each other in a cycle over groups %s; named: %s, waiting in "
            "%s%s%s. Until then every rank had issued group '%s''s collectives at the same places among group "
            "'%s''s; %s broke that order here: %s skipped %s seq %s on group '%s' (%s %s in it) and went on into "
            "group '%s', or entered the groups in another order on this step only."
            % (
                format_ranks(cyc.get("ranks", diag.culprit_ranks), 12),
                groups or "?",
                who,
                coll,
                _where(diag),
                _doing(diag),
                bo.get("group"),
                bo.get("other_group"),
                _ranks(side),
                _verb(side, "it", "they"),
                bo.get("op"),
                bo.get("seq"),
                bo.get("group"),
                _ranks(bo.get("waiters")),
                _verb(bo.get("waiters")),
                bo.get("other_group"),
            )
        )
    return (
        "Cross-group deadlock: ranks %s wait on each other in a cycle over groups %s "
        "(entered in different orders); named: %s, waiting in %s%s%s."
        % (
            format_ranks(cyc.get("ranks", diag.culprit_ranks), 12),
            groups or "?",
            who,
            coll,
            _where(diag),
            _doing(diag),
        )
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


def _stuck(diag: Diagnosis, who: str, coll: str, d: Dict[str, Any]) -> str:
    if not diag.culprit_ranks and diag.culprit_actors:  # rules/actors.py, actor_waits.py
        return actor_stuck(diag, d)
    if d.get("exit_wait"):  # rules/exit_wait.py: the program returned, the process does not exit
        return _exit_wait(diag, d)
    reason, doing = _reason(diag), _doing(diag)
    reason = blocked_on(reason) or reason  # (the sentence says "not in any collective" already)
    if reason.startswith(LOOP_IDLE):  # (its stack is the loop's own frames: the await chain said where)
        doing = ""
    child = len(diag.culprit_ranks) == 1 and d.get("child_wait_how") is not None  # analyze/stuck/childwait.py
    if child:
        reason, doing = _child_reason(d), ""
    after = _stuck_after(d, child)
    waiters = _stuck_waiters(diag, coll, d)
    return "Stuck outside collectives: %s %s not in any collective%s: %s%s.%s %s" % (
        who,
        "are" if len(diag.culprit_ranks) > 1 else "is",
        _where(diag),
        reason or "it made no progress",
        doing,
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


def _dead(diag: Diagnosis, who: str, coll: str, d: Dict[str, Any]) -> str:
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
        s += " %d other rank(s) failed after it (cascade, e.g. rank %d: %s)." % (
            len(rest),
            rest[0]["rank"],
            clip(short_error(rest[0].get("text")) or rest[0].get("cause") or "", 100),
        )
    elif diag.waiting_ranks and not casc:
        s += " %s %s for it." % (_ranks(diag.waiting_ranks), _verb(diag.waiting_ranks))
    return s


def _transport(diag: Diagnosis, who: str, coll: str, d: Dict[str, Any]) -> str:
    s = "Transport error: %s failed first in %s with '%s', and no rank is dead%s." % (
        who,
        coll or "a collective",
        clip(d.get("cause_text") or "", 160),
        _where(diag),
    )
    if diag.cascade:
        s += " %d more rank(s) failed after it." % len(diag.cascade)
    return s


def _progressing(diag: Diagnosis, who: str, coll: str, d: Dict[str, Any]) -> str:
    age = d.get("last_progress_age_s")
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


def _unknown(diag: Diagnosis, who: str, coll: str, d: Dict[str, Any]) -> str:
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


def _waiting(diag: Diagnosis) -> str:
    return (
        (" %s %s for it" % (_ranks(diag.waiting_ranks), _verb(diag.waiting_ranks)))
        if diag.waiting_ranks
        else ""
    )


def _reason(diag: Diagnosis) -> str:
    reasons = (diag.details or {}).get("culprit_reasons") or {}
    if diag.culprit_ranks and str(diag.culprit_ranks[0]) in reasons:
        return str(reasons[str(diag.culprit_ranks[0])])
    return ""


#: the opening sentences per kind (any other kind reads as unknown)
_BY_KIND: Dict[str, Callable[[Diagnosis, str, str, Dict[str, Any]], str]] = {
    Kind.COLLECTIVE_MISMATCH.value: _mismatch,
    Kind.SKIPPED_COLLECTIVE.value: _skipped,
    Kind.CROSS_GROUP_DEADLOCK.value: _deadlock,
    Kind.STUCK_OUTSIDE_COLLECTIVE.value: _stuck,
    Kind.DEAD_RANK.value: _dead,
    Kind.TRANSPORT_ERROR.value: _transport,
    Kind.PROGRESSING.value: _progressing,
    Kind.UNKNOWN.value: _unknown,
    Kind.ACTOR_DEADLOCK.value: _actor_deadlock,
    Kind.UNSCHEDULABLE_ACTOR.value: _unschedulable,
}


def verdict_paragraph(diag: Diagnosis) -> str:
    """One paragraph (a str, no trailing newline) a human reads first."""
    s = _BY_KIND.get(str(diag.kind), _unknown)(
        diag, _ranks(diag.culprit_ranks), _coll(diag), diag.details or {}
    )
    rep = (diag.details or {}).get("replacement")
    if rep:  # analyze/failures/lonerestart.py: the rank was restarted alone
        s += (
            " It was restarted alone: its new process %s; the other ranks kept the process group it died in, "
            "which a new process cannot join." % rep.get("text")
        )
    s += _ray_text(diag)  # issue 4
    s += _memory_text(diag)  # issue 5
    s += _holders_text(diag)  # issue 9
    nxt = next_step(diag)
    if nxt:
        s += " Next: %s." % nxt
    return " ".join(s.split())
