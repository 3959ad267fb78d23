"""Earlier attempts of a restarted rank: did they fail the same way? (pure)

``torchrun --max-restarts N`` (and a Ray actor's ``max_restarts``) starts a rank again after
a failure; the process model keeps the newest process for the rank and lists the earlier
ones as a ``restart`` claim (``process_model.RankClaim``). A job that fails the same way in
every attempt (a bad sample after the newest checkpoint: blind helper 68's three attempts,
each dying at step 7 on rank 2) should say so in one verdict, not leave the user to match
one snapshot per attempt.

In: the context (``ctx.dups``: per rank, kind and the earlier processes' keys) and the
dead root. Out: ``details['attempts']`` (``{'rank', 'count', 'same', 'steps'}``: the
attempts of the rank, how many ended with the root's exception line or cause, the step
each ended at) and an evidence line; nothing when the rank was not restarted.
"""

from __future__ import annotations

from typing import Any, List, Optional

from hangtrace.tracer.analyze.context import Ctx
from hangtrace.tracer.analyze.rankview import RankView, index_process
from hangtrace.tracer.analyze.failures.deaths import fill_death
from hangtrace.tracer.diagnosis import Diagnosis


def last_line(text: Optional[str]) -> str:
    """The last non-empty line of an exception text (``'ValueError: sequence length 0'``)."""
    lines = [ln.strip() for ln in str(text or "").splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def _how(v: RankView) -> str:
    return last_line(v.cause_text) or str(v.cause or "")


def restarts(ctx: Ctx, d: Diagnosis, root: RankView) -> None:
    """Fills ``details['attempts']`` for a dead root whose rank was restarted."""
    keys: List[str] = []
    if (
        root.rank in ctx.replaced
    ):  # restarted alone: its replacement is described instead (analyze/failures/replacement.py)
        return
    for r, kind, _kept, others in ctx.dups:
        if r == root.rank and kind == "restart":
            keys = list(others)
    if not keys:
        return
    by_key = {p.key: p for p in ctx.snap.processes}
    views = []
    for k in keys:
        p = by_key.get(k)
        if p is not None:
            v = index_process(root.rank, p)
            fill_death(v)
            views.append(v)
    mine = _how(root)
    same = [v for v in views if v.dead and mine and _how(v) == mine]
    steps: List[Any] = [v.step for v in views] + [root.step]
    d.details["attempts"] = {
        "rank": root.rank,
        "count": len(views) + 1,
        "same": len(same) + 1,
        "steps": steps,
    }
    ctx.add(
        "rank %d ran in %d attempts (restarts: earlier processes %s); %d of them ended with %s%s"
        % (
            root.rank,
            len(views) + 1,
            ", ".join(keys[:4]),
            len(same) + 1,
            mine[:160] or "the same cause",
            " (steps: %s)" % ", ".join(str(s) for s in steps) if any(s is not None for s in steps) else "",
        )
    )
