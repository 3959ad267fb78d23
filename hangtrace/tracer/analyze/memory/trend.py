"""Trends: memory growth per step (pure).

Trends (:func:`trend`): per metric, the level at the first sample of each step; least
squares bytes/step; *steady* when at least 3 steps, the slope is above the threshold and
at least 75 % of step-to-step changes are increases; mean growth per phase from the
ledger; the step at which the limit is reached at that rate.
"""

import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

from hangtrace.tracer.analyze.memory.samples import _thr
from hangtrace.tracer.ring.memsamples import Sample


def _series(ss: Sequence[Sample], metric: str) -> List[Tuple[int, int, Optional[int]]]:
    """[(step, value, limit)] - the first sample of each step."""
    out = {}
    for s in ss:
        v = s["values"].get(metric)
        if v is None or s["step"] is None or s["source"] == "oom":
            continue
        if s["step"] not in out:
            out[s["step"]] = (v, s["limits"].get(metric))
    return sorted((st, v, lim) for st, (v, lim) in out.items())


def trend(ss: Sequence[Sample], rows: List[Dict[str, Any]], metric: str) -> Optional[Dict[str, Any]]:
    """Growth of ``metric`` per step (dict) or None with fewer than 3 steps."""
    ser = _series(ss, metric)
    if len(ser) < 3:
        return None
    per_phase: Dict[Any, List[int]] = {}
    for r in rows:
        if r["metric"] == metric and r["delta"] is not None and r["depth"] == 0:
            per_phase.setdefault(r["phase"], []).append(r["delta"])
    limit, headroom_base = _limit(ss, metric)
    newest = ser[-1][1]
    for s in reversed(ss):
        if metric in s["values"]:
            newest = s["values"][metric]
            break
    return trend_of(metric, ser, per_phase, limit, headroom_base, newest)


def _limit(ss: Sequence[Sample], metric: str) -> Tuple[Optional[int], Optional[int]]:
    """``(limit, headroom_base)``: the newest limit of ``metric``; RSS has no limit of its
    own: the (possibly shared) cgroup's limit bounds it, and this rank's growth eats the
    cgroup's remaining headroom (``headroom_base``: the cgroup usage then; None for a
    metric's own limit)."""
    for s in reversed(ss):
        if s["limits"].get(metric):
            return s["limits"][metric], None
        if metric == "rss" and s["limits"].get("cgroup") and s["values"].get("cgroup") is not None:
            return s["limits"]["cgroup"], s["values"]["cgroup"]
    return None, None


def trend_of(
    metric: str,
    ser: List[Tuple[int, int, Optional[int]]],
    per_phase: Dict[Any, List[int]],
    limit: Optional[int],
    headroom_base: Optional[int],
    newest: int,
) -> Dict[str, Any]:
    """The trend dict of ``metric`` from its series ``ser`` ([(step, bytes, limit)], the
    first sample of each step, >= 3 steps), the deltas of its finished top-level ledger rows
    per phase (``per_phase``, phases in row order), its limit (:func:`_limit`) and its
    newest figure (bytes)."""
    xs = [float(s) for s, _v, _l in ser]
    ys = [float(v) for _s, v, _l in ser]
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    thr = _thr(ys)
    rise = 0.25 * max(slope, 1)  # (a step-to-step change above this is an increase)
    ups = sum(1 for a, b in zip(ys, ys[1:]) if b - a > rise)
    steady = slope > thr and ups >= 0.75 * (n - 1)
    phase_growth = {ph: int(sum(d) / len(d)) for ph, d in per_phase.items()}
    last_step, last_v = ser[-1][0], ser[-1][1]
    proj = None
    if steady and limit and slope > 0:
        proj = last_step + max(
            0, int(math.ceil((limit - (last_v if headroom_base is None else headroom_base)) / slope))
        )
    growing = max(phase_growth.items(), key=lambda kv: kv[1])[0] if phase_growth else None
    return {
        "metric": metric,
        "steps": [ser[0][0], last_step],
        "nsteps": n,
        "bytes_per_step": int(slope),
        "steady": bool(steady),
        "first": int(ys[0]),
        "last": int(newest),
        "limit": limit,
        "projected_limit_step": proj,
        "phase_growth": phase_growth,
        "growing_phase": growing if growing is not None and phase_growth.get(growing, 0) > thr else None,
    }
