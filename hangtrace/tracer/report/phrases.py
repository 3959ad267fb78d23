"""Phrases shared by the sentences of the verdict paragraph (pure): a ``Diagnosis`` in,
a piece of a sentence out - the collective and its group, where (phase, step), what the
culprit does (its top frames), its reason, who waits for it. Split from ``paragraph.py``."""

from typing import Optional

from hangtrace.tracer.analyze.stuck.stacktree import format_ranks
from hangtrace.tracer.diagnosis import Diagnosis
from hangtrace.tracer.report.words import ranks_text as _ranks, verb as _verb


def group_text(diag: Diagnosis) -> Optional[str]:
    """ "group 'g' (desc) [ranks 0-3]" for the verdict's group, or None without one."""
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


def where(diag: Diagnosis) -> str:
    """' at phase 'p', step 4' for the verdict's phase and step ('' if both unknown)."""
    parts = []
    if diag.phase:
        parts.append("phase '%s'" % diag.phase)
    if diag.step is not None:
        parts.append("step %s" % diag.step)
    return " at " + ", ".join(parts) if parts else ""


def doing(diag: Diagnosis) -> str:
    """'; it is in f < g < h < ... < user frame': what the culprit does (its top frames; '' without)."""
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


def coll_text(diag: Diagnosis) -> str:
    """'op seq N on group ...' for the verdict's collective ('' if unknown)."""
    s = ""
    if diag.op:
        s += diag.op
    if diag.seq is not None:
        s += " seq %s" % diag.seq
    g = group_text(diag)
    if g:
        s += " on " + g
    return s.strip()


def waiting(diag: Diagnosis) -> str:
    """' ranks 0-2 wait for it' ('' when nobody waits)."""
    return (
        (" %s %s for it" % (_ranks(diag.waiting_ranks), _verb(diag.waiting_ranks)))
        if diag.waiting_ranks
        else ""
    )


def reason(diag: Diagnosis) -> str:
    """The first culprit's reason (``details['culprit_reasons']``), or ''."""
    reasons = (diag.details or {}).get("culprit_reasons") or {}
    if diag.culprit_ranks and str(diag.culprit_ranks[0]) in reasons:
        return str(reasons[str(diag.culprit_ranks[0])])
    return ""
