"""Ledger and kept-across flags (pure).

Ledger (:func:`ledger`): one row per (rank, step, phase, metric): the value sampled just
after the phase was entered and just before it was left, ``delta`` = exit - enter (a
phase still open when the process died has ``exit`` None and its newest sample in
``last``).

Kept across phase boundaries (:func:`kept_across`): per rank and metric, a step *kept*
memory when its last phase ended more than a threshold above where its first phase began
(threshold: max(1 MiB, 1 % of the metric's peak)), and *released* it when within the
threshold. A flag is raised when some steps keep and others release and a phase is present
in every keeping step but not in every releasing one (e.g. validation on steps 2, 4 with a
checkpoint every step): it names the steps, the phase where the memory grew and the phases
after it in those steps (the sequence, e.g. ``validation -> checkpoint``), and the bytes
kept per step.
"""

from typing import Any, Dict, List, Optional, Sequence, Tuple

from hangtrace.tracer.analyze.memory.samples import MIB, _thr
from hangtrace.tracer.ring.memsamples import Sample


def ledger(ss: Sequence[Sample], rank: Optional[int] = None) -> List[Dict[str, Any]]:
    """Ledger rows of one process's samples (see module doc), in phase-entry order."""
    rows = []
    stacks: Dict[Any, List[Dict[str, Any]]] = {}  # (thread, metric) -> [row, ...] open phases
    for s in ss:
        src = s["source"]
        if src not in ("phase_enter", "phase_exit"):
            # timer/step/oom samples: the newest value seen inside the open phases
            for (_th, mm), st in stacks.items():
                if st and mm in s["values"]:
                    st[-1]["last"] = s["values"][mm]
            continue
        for m, val in s["values"].items():
            key = (s["thread"], m)
            st = stacks.setdefault(key, [])
            if src == "phase_enter":
                row = {
                    "rank": rank,
                    "step": s["step"],
                    "phase": s["phase"],
                    "metric": m,
                    "enter": val,
                    "exit": None,
                    "delta": None,
                    "last": val,
                    "depth": len(st),
                    "t_enter_ns": s["t_wall_ns"],
                    "limit": s["limits"].get(m),
                }
                st.append(row)
                rows.append(row)
            else:
                for i in range(len(st) - 1, -1, -1):
                    if st[i]["phase"] == s["phase"]:
                        row = st[i]
                        row["exit"] = val
                        row["last"] = val
                        row["delta"] = val - row["enter"]
                        if s["limits"].get(m):
                            row["limit"] = s["limits"][m]
                        del st[i:]
                        break
    return rows


def _by_metric(rows: List[Dict[str, Any]]) -> Dict[str, List[Dict[str, Any]]]:
    out: Dict[str, List[Dict[str, Any]]] = {}
    for r in rows:
        out.setdefault(r["metric"], []).append(r)
    return out


def _steps_of(rows: List[Dict[str, Any]]) -> Dict[Any, List[Dict[str, Any]]]:
    """{step: [top-level rows in order]} for rows with a step."""
    steps: Dict[Any, List[Dict[str, Any]]] = {}
    for r in rows:
        if r["step"] is None or r["depth"] != 0:
            continue
        steps.setdefault(r["step"], []).append(r)
    return steps


def _period(steps: List[int]) -> Optional[int]:
    steps = sorted(set(steps))
    if len(steps) < 2:
        return None
    diffs = {b - a for a, b in zip(steps, steps[1:])}
    return diffs.pop() if len(diffs) == 1 else None


def _net_per_step(
    steps: Dict[Any, List[Dict[str, Any]]], metric: str
) -> Tuple[Dict[Any, int], Dict[Any, List[Any]]]:
    """Per finished step: bytes at its end minus bytes at its start; and its phase sequence."""
    net: Dict[Any, int] = {}
    seqs: Dict[Any, List[Any]] = {}
    order = sorted(steps)
    for st, rs in steps.items():
        seqs[st] = [r["phase"] for r in rs]
        if rs[-1]["exit"] is None:
            continue  # the step did not finish (died in it)
        if len(order) > 2 and (st == order[-1] or (st == order[0] and metric in ("rss", "cgroup"))):
            continue  # the newest step may be cut short by a failure; host memory warms up in the first
        net[st] = rs[-1]["exit"] - rs[0]["enter"]
    return net, seqs


def _grown_in(steps: Dict[Any, List[Dict[str, Any]]], kept: List[Any], thr: int, only: List[Any]) -> Any:
    """Where it grew: after the last phase that began at the step's starting level, the
    first phase that ended above it (growth later given back, e.g. an engine's wake_up
    undone by its sleep, is not what was kept); majority over keeping steps."""
    grow: Dict[str, int] = {}
    for s in kept:
        rs = steps[s]
        base = rs[0]["enter"]
        i0 = max([i for i, r in enumerate(rs) if r["enter"] <= base + thr] or [0])
        for r in rs[i0:]:
            if r["exit"] is not None and r["exit"] > base + thr:
                grow[r["phase"]] = grow.get(r["phase"], 0) + 1
                break
    return max(grow.items(), key=lambda kv: kv[1])[0] if grow else only[0]


def kept_across(rows: List[Dict[str, Any]], rank: Optional[int] = None) -> List[Dict[str, Any]]:
    """Kept-across-phase-boundary flags of one process's ledger rows (see module doc)."""
    flags = []
    for metric, mrows in _by_metric(rows).items():
        if metric == "cgroup":
            continue  # shared by the ranks of a container: its growth is nobody's in particular
        f = kept_flag(metric, mrows, rank)
        if f is not None:
            flags.append(f)
    return flags


def kept_threshold(metric: str, thr: int) -> int:
    """The bytes a step must keep to count as keeping, from the metric's noise threshold
    ``thr`` (``samples._thr`` of its ledger figures): host figures move with allocator
    arenas and the page cache."""
    if metric in ("rss", "cgroup"):
        return max(thr, 8 * MIB, int(2 * thr))
    return thr


def kept_flag(
    metric: str, mrows: List[Dict[str, Any]], rank: Optional[int] = None
) -> Optional[Dict[str, Any]]:
    """The kept-across flag of one metric's ledger rows ``mrows`` (row order), or None."""
    steps = _steps_of(mrows)
    thr = kept_threshold(metric, _thr([r["enter"] for r in mrows] + [r["exit"] for r in mrows]))
    net, seqs = _net_per_step(steps, metric)
    kept = sorted(s for s, n in net.items() if n > thr)
    released = sorted(s for s, n in net.items() if abs(n) <= thr)
    if not kept or not released:
        return None
    in_all_kept = set.intersection(*(set(seqs[s]) for s in kept))
    in_all_rel = set.intersection(*(set(seqs[s]) for s in released))
    only = sorted(in_all_kept - in_all_rel)
    if not only:
        return None
    grown_in = _grown_in(steps, kept, thr, only)
    s0 = kept[0]
    seq0 = seqs[s0]
    i = seq0.index(grown_in) if grown_in in seq0 else 0
    sequence = seq0[i:]
    # the step after a keeping step: the first phase that begins with the memory held
    carried = [
        {"step": s + 1, "phase": steps[s + 1][0]["phase"], "enter": steps[s + 1][0]["enter"]}
        for s in kept
        if steps.get(s + 1)
    ]
    return {
        "rank": rank,
        "metric": metric,
        "kept_steps": kept,
        "released_steps": released,
        "bytes_kept": {str(s): net[s] for s in kept},
        "bytes_kept_median": sorted(net[s] for s in kept)[len(kept) // 2],
        "grown_in": grown_in,
        "sequence": sequence,
        "held_by": sequence[1:],
        "only_in_kept_steps": only,
        "kept_sequence": seq0,
        "released_sequence": seqs[released[0]],
        "carried_into": carried[:4],
        "periods": {ph: _period([s for s, q in seqs.items() if ph in q]) for ph in set(sequence) | set(only)},
        "threshold": thr,
    }
