"""The verdict paragraph a human reads first (pure): which rank(s), group (name, desc, ranks),
seq/op, phase, step, what the culprit does (top frames), why the others wait, what next.

The opening sentences per verdict kind are in ``collparagraph`` (about a collective),
``rankparagraph`` (a rank's own state, no culprit) and ``rayparagraph`` (Ray actors), over
the shared phrases of ``phrases``; the advice in ``nextstep``."""

from typing import Any, Callable, Dict, List

from hangtrace.tracer.diagnosis import Diagnosis, Kind
from hangtrace.tracer.report.collparagraph import deadlock_text, mismatch_text, skipped_text
from hangtrace.tracer.report.memorytext import holders_text as _holders_text, memory_text as _memory_text
from hangtrace.tracer.report.nextstep import next_step
from hangtrace.tracer.report.phrases import coll_text as _coll
from hangtrace.tracer.report.rankparagraph import (
    dead_text,
    progressing_text,
    stuck_text,
    transport_text,
    unknown_text,
)
from hangtrace.tracer.report.rayparagraph import (
    actor_deadlock as _actor_deadlock,
    ray_text as _ray_text,
    unschedulable as _unschedulable,
)
from hangtrace.tracer.report.words import ranks_text as _ranks

__all__ = ["verdict_paragraph"]


#: the opening sentences per kind (any other kind reads as unknown)
_BY_KIND: Dict[str, Callable[[Diagnosis, str, str, Dict[str, Any]], str]] = {
    Kind.COLLECTIVE_MISMATCH.value: mismatch_text,
    Kind.SKIPPED_COLLECTIVE.value: skipped_text,
    Kind.CROSS_GROUP_DEADLOCK.value: deadlock_text,
    Kind.STUCK_OUTSIDE_COLLECTIVE.value: stuck_text,
    Kind.DEAD_RANK.value: dead_text,
    Kind.TRANSPORT_ERROR.value: transport_text,
    Kind.PROGRESSING.value: progressing_text,
    Kind.UNKNOWN.value: unknown_text,
    Kind.ACTOR_DEADLOCK.value: _actor_deadlock,
    Kind.UNSCHEDULABLE_ACTOR.value: _unschedulable,
}


def verdict_paragraph(diag: Diagnosis) -> str:
    """One paragraph (a str, no trailing newline) a human reads first."""
    s = _BY_KIND.get(str(diag.kind), unknown_text)(
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
    s += _nodes_text(diag)  # issue 39
    nxt = next_step(diag)
    if nxt:
        s += " Next: %s." % nxt
    return " ".join(s.split())


def _nodes_text(diag: Diagnosis) -> str:
    """Issue 39: where the culprits run in a multi-node job, and the nodes not seen
    (``analyze/nodes.py``, ``details['nodes']``)."""
    nodes = (diag.details or {}).get("nodes") or {}
    out = ""
    by_node: Dict[str, List[int]] = {}
    for r, w in (nodes.get("culprits") or {}).items():
        by_node.setdefault(str(w), []).append(int(r))
    for w, rs in sorted(by_node.items()):
        out += " %s %s on %s." % (_ranks(sorted(rs)).capitalize(), "is" if len(rs) == 1 else "are", w)
    unseen = nodes.get("unseen") or []
    if unseen:
        out += " Not seen (the verdict is without them): %s." % "; ".join(unseen)
    return out
