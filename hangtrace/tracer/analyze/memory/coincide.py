"""Periodic phases that coincide on the step a rank ran out of memory (pure).

Validation every 25 steps and a checkpoint every 15 first run in one step at step 75: a job
whose memory fits either alone dies there, and nowhere before (blind helper 99, 2026-12-04:
a Ray trainer killed by its memory cgroup's OOM killer at step 75, phase 'checkpoint'; the
advice named validation's memory alone, "free it before the step ends", and not the
schedule). The brief's own example: "CUDA runs out of memory only on steps where validation
and checkpoint coincide".

:func:`coinciding` reads one rank's ledger rows (``ledger.ledger``: one per step, phase and
metric): the phases that ran on the death step, each of which runs on a regular period of
more than one step (``ledger._period`` over every step it ran on, that one included). Two
or more of them make the sentence, with whether that step is the first on which they all ran.
"""

from typing import Any, Dict, List, Optional, Set

from hangtrace.tracer.analyze.memory.ledger import _period


def coinciding(rows: List[Dict[str, Any]], step: Any, rank: Any) -> Optional[str]:
    """``"step 75 is the first step on which 'validate' (every 25 steps) and 'checkpoint'
    (every 15 steps) both ran, and rank 1 ran out of memory in it: free what 'validate' holds
    before 'checkpoint' starts, ..."`` (the phases in their order in that step), or None when
    fewer than two periodic phases ran on ``step`` (an int; None: unknown)."""
    if not isinstance(step, int):
        return None
    steps_of: Dict[str, Set[int]] = {}
    for r in rows:
        if isinstance(r.get("step"), int) and r.get("phase"):
            steps_of.setdefault(str(r["phase"]), set()).add(r["step"])
    all_steps: Set[int] = set().union(*steps_of.values()) if steps_of else set()
    periodic: Dict[str, int] = {}
    for ph, ss in steps_of.items():
        per = _period(sorted(ss)) if step in ss else None
        if per and per > 1 and len(ss) < len(all_steps):
            periodic[ph] = per
    if len(periodic) < 2:
        return None
    in_step = [str(r["phase"]) for r in rows if r.get("step") == step and str(r.get("phase")) in periodic]
    names = list(dict.fromkeys(in_step))  # (their order in that step: rows are in phase-entry order)
    together = sorted(set.intersection(*(steps_of[p] for p in names)))
    first = together[0] == step
    return (
        "step %s is %s step on which %s both ran%s, and rank %s ran out of memory in it: free what '%s' "
        "holds before '%s' starts, or schedule them on different steps"
        % (
            step,
            "the first" if first else "a",
            " and ".join("'%s' (every %d steps)" % (p, periodic[p]) for p in names),
            "" if first else " (as on step %s)" % together[0],
            rank,
            names[0],
            names[-1],
        )
    )
