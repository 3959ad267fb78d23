"""Phrases shared by the sentences of the verdict paragraph (pure): a ``Diagnosis`` in,
a piece of a sentence out - the collective and its group, where (phase, step), what the
culprit does (its top frames), its reason, who waits for it. Split from ``paragraph.py``."""

from typing import Optional

from hangtrace.tracer.analyze.stuck.place import place_text
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
    """'; it is in user frame > its call > (N more) > innermost': where the culprit is
    (:func:`frames_text`; '' without)."""
    if not diag.frames:
        return ""
    d, r = diag.details or {}, "rank %d" % diag.culprit_ranks[0] if len(diag.culprit_ranks) > 1 else None
    if d.get("culprit_idle_in"):  # (its call returned: the frames of that loop say nothing; alive or not)
        return "; %s stack shows it back in %s, idle" % (r + "'s" if r else "its", d["culprit_idle_in"])
    verb = "raised" if d.get("frames_from") == "traceback" else "is"  # (dead: traceback)
    att = ((d.get("memory") or {}).get("attribution") or {}).get(str(diag.culprit_ranks[0]), {})
    if verb == "raised" and att.get(
        "helper_text"
    ):  # (the worker's death is the news: where the rank noticed it)
        verb = "noticed it and raised"
    return "; %s %s in %s" % (r or "it", verb, frames_text(diag))


def frames_text(diag: Diagnosis) -> str:
    """Where the culprit is, outer > inner: user-first when a frame is the user's own code
    (``details['place']``: its frame and the library call it made, the internals folded;
    ``analyze/stuck/place.py``), else its three innermost frames ('... > ' when more)."""
    d = diag.details or {}
    if d.get("place"):
        return place_text(d["place"])
    shown = list(reversed(diag.frames[:3]))
    user = d.get("user_frame")
    if user:  # (no place: a verdict of before issue 41, re-rendered)
        gap = " > " if diag.frames[3:4] == [user] else " > ... > "  # (no frame left out: no '...')
        return str(user) + gap + " > ".join(shown)
    return ("... > " if len(diag.frames) > 3 else "") + " > ".join(shown)


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
