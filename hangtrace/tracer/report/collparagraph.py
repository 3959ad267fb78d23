"""The opening sentences of the verdicts about a collective (pure): collective mismatch,
skipped collective (extra, left, never reached) and cross-group deadlock. A ``Diagnosis``,
the culprit ranks' text ``who``, the collective's text ``coll`` and ``diag.details`` in;
the sentences out. Split from ``paragraph.py``, which composes them."""

from typing import Any, Dict, List

from hangtrace.tracer.analyze.stuck.stacktree import format_ranks
from hangtrace.tracer.diagnosis import Cause, Diagnosis
from hangtrace.tracer.report.phrases import (
    doing as _doing,
    reason as _reason,
    waiting as _waiting,
    where as _where,
)
from hangtrace.tracer.report.words import ranks_text as _ranks, verb as _verb


def _sig_where(sig: Dict[str, Any]) -> str:
    """' in phase 'rollout', step 4' for one signature class of a mismatch ('' if unknown)."""
    parts = []
    if sig.get("phase"):
        parts.append("phase '%s'" % sig["phase"])
    if sig.get("step") is not None:
        parts.append("step %s" % sig["step"])
    return " in " + ", ".join(parts) if parts else ""


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


def _special(diag: Diagnosis, who: str, coll: str, d: Dict[str, Any]) -> str:
    """The mismatches told apart from the signature comparison, or ''."""
    if d.get("group_order"):  # ranks that created their groups in another order (analyze/graph/groupdefs.py)
        return "Collective mismatch: %s." % d["group_order"]["text"]
    if diag.cause == Cause.SEQUENCE_DIVERGED:
        return (
            "Collective mismatch: %s %s in %s, which the other members already passed: the "
            "sequence of collectives on this group diverged%s%s."
            % (who, _verb(diag.culprit_ranks), coll, _where(diag), _doing(diag))
        )
    ab = d.get("size_abort")  # analyze/graph/sizeabort.py: gloo's size check aborted a rank
    if ab and not d.get("signatures") and coll:
        return _unmatched_text(diag, who, coll, ab)
    return ""


def mismatch_text(diag: Diagnosis, who: str, coll: str, d: Dict[str, Any]) -> str:
    """The sentences of a collective mismatch (rules/mismatch.py, analyze/graph/)."""
    special = _special(diag, who, coll, d)
    if special:
        return special
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
    threads = threads or _changed_text(diag, d)
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


def _unmatched_text(diag: Diagnosis, who: str, coll: str, ab: Dict[str, Any]) -> str:
    """A size-check abort at a call the peers never made (no signatures to compare)."""
    return "Collective mismatch: %s issued %s at %s, a call %s never made%s%s. %s" % (
        who,
        diag.op,
        coll,
        _ranks(ab.get("peers")),
        _where(diag),
        _doing(diag),
        _abort_text(diag, ab),
    )


def _changed_text(diag: Diagnosis, d: Dict[str, Any]) -> str:
    """Which side changed by its own loop (``changed_by_history``), else the size-check abort's
    sentence (without its period), else ''."""
    if d.get("changed_by_history"):
        return _history_text(d["changed_by_history"])
    if d.get("size_abort"):
        return _abort_text(diag, d["size_abort"])[:-1]
    return ""


def _abort_text(diag: Diagnosis, ab: Dict[str, Any]) -> str:
    """The sentence of ``details['size_abort']``: the abort and the peers' errors are consequences."""
    r = ab.get("rank")
    peers = ab.get("peers") or []
    return 'gloo\'s size check aborted %s (SIGABRT: "%s")%s%s: consequences of the mismatch, not causes.' % (
        "it" if diag.culprit_ranks == [r] else "rank %s" % r,
        ab.get("text"),
        ", which is not the rank that changed" if r not in (diag.culprit_ranks or []) else "",
        " and %s then failed with a connection error" % _ranks(peers) if peers else "",
    )


def _history_text(h: Dict[str, Any]) -> str:
    """The sentence of ``details['changed_by_history']``: who left its loop early, or whose
    collective is new to its loop, against the victims' per-step one."""
    ranks, victims = h.get("ranks") or [], h.get("victims") or []
    ops, steps = h.get("ops") or {}, h.get("steps") or {}
    first = str(ranks[0]) if ranks else ""
    every = all((h.get("status") or {}).get(str(v), "routine") == "routine" for v in victims)
    theirs = "%s %s in %s, the collective %s" % (
        _ranks(victims),
        _verb(victims, "waits", "wait"),
        "/".join(sorted({str(ops.get(str(v))) for v in victims})),
        ("%s every earlier step issued at this place" if every else "%s loop issued before")
        % ("its" if len(victims) == 1 else "their"),
    )
    if h.get("left_loop"):
        return (
            "%s left %s loop early (its %s comes after its loop, in another phase) while %s: uneven "
            "inputs per rank, or a loop that ended on one rank"
            % (
                _ranks(h["left_loop"]),
                "its" if len(h["left_loop"]) == 1 else "their",
                ops.get(first),
                theirs,
            )
        )
    return (
        "%s's %s is new to %s loop (none of its %s earlier steps issued it) while %s: %s took another "
        "path in its loop (rank-specific code such as a rank-0-only callback)"
        % (
            _ranks(ranks),
            ops.get(first),
            "its" if len(ranks) == 1 else "their",
            steps.get(first),
            theirs,
            _ranks(ranks),
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


def skipped_text(diag: Diagnosis, who: str, coll: str, d: Dict[str, Any]) -> str:
    """The sentences of a skipped collective: a rank that left, an extra collective, or never reached."""
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
        rz = d.get("rendezvous")  # analyze/actors/rendezvous.py: the others wait at an actor
        return (
            "Skipped collective: %s alone entered %s%s%s; the other members never call it and "
            "went on, so %s %s forever.%s"
            % (
                who,
                coll,
                _where(diag),
                _doing(diag),
                who,
                _verb(diag.culprit_ranks),
                (
                    " Rank %s went on to %s, a Ray actor's method every rank calls in turn, and waits "
                    "there for %s (cascade)." % (rz.get("rank"), rz.get("method"), _ranks(rz.get("behind")))
                )
                if rz
                else "",
            )
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


def deadlock_text(diag: Diagnosis, who: str, coll: str, d: Dict[str, Any]) -> str:
    """The sentences of a cross-group deadlock (analyze/graph/grouporder.py when an order broke)."""
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
