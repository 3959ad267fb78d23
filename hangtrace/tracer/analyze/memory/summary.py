"""The memory summary of a diagnosis (``details['memory']``): per-process analysis,
flags and trends worth reporting, advice, and the watcher's memory lines (pure)."""

from typing import Any, Dict, List, Optional, Set, Tuple

from hangtrace.tracer.analyze.memory.coincide import coinciding
from hangtrace.tracer.analyze.memory.colledger import analyse_columns
from hangtrace.tracer.analyze.memory.columns import columns
from hangtrace.tracer.analyze.memory.ledger import kept_across, ledger
from hangtrace.tracer.analyze.memory.samples import (
    MIB,
    _last_host,
    _level,
    _metrics,
    _peak,
    _primary,
    _sb,
    _where,
    fmt_bytes,
)
from hangtrace.tracer.analyze.memory.trend import trend
from hangtrace.tracer.ring.memsamples import MemSamples, samples

LEDGER_MAX_STEPS = 16


LEDGER_MAX_RANKS = 8


def analyse_process(proc: Any, rank: Optional[int] = None) -> Dict[str, Any]:
    """Samples, ledger rows, kept flags, trends and level figures of one process (dict:
    ``samples``, ``rows``, ``kept``, ``trends``, ``figures``: ``(metric, last, limit, peak)``,
    peak = ``(bytes, sample)`` or None). Read from the samples' columns when they have them
    (``columns.py``, ``colledger.py``: no dict per sample), else from the sample dicts."""
    ss = getattr(proc, "memory", None) or MemSamples(proc.records)
    c = columns(ss)
    if c is not None:
        return dict(analyse_columns(c, rank), samples=ss)
    rows = ledger(ss, rank)
    flags = kept_across(rows, rank)
    trends = {}
    for m in _metrics(ss):
        if not _primary(ss, m):
            continue
        t = trend(ss, rows, m)
        if t is not None:
            trends[m] = t
    metric, val, lim = _level(_last_host(ss))
    pk = _peak(ss, metric) if metric else None
    return {
        "samples": ss,
        "rows": rows,
        "kept": flags,
        "trends": trends,
        "figures": (metric, val, lim, pk),
    }


def _flag_text(f: Dict[str, Any]) -> str:
    seq = " -> ".join(f["sequence"])
    rel = f["released_steps"]
    s = "rank %s: %s kept %s across %s on step%s %s (grown in '%s'%s), released on step%s %s (%s)" % (
        f["rank"],
        f["metric"],
        fmt_bytes(f["bytes_kept_median"]),
        seq,
        "s" if len(f["kept_steps"]) > 1 else "",
        ", ".join(map(str, f["kept_steps"][:8])),
        f["grown_in"],
        ", not given back by %s" % " / ".join("'%s'" % p for p in f["held_by"]) if f["held_by"] else "",
        "s" if len(rel) > 1 else "",
        ", ".join(map(str, rel[:8])),
        " -> ".join(f["released_sequence"]),
    )
    if f["carried_into"]:
        c = f["carried_into"][0]
        s += "; step %s began '%s' with %s" % (c["step"], c["phase"], fmt_bytes(c["enter"]))
    return s


def _trend_text(who: str, t: Dict[str, Any]) -> str:
    s = "%s: %s grows %s/step over steps %s-%s (%s -> %s)" % (
        who,
        t["metric"],
        fmt_bytes(t["bytes_per_step"]),
        t["steps"][0],
        t["steps"][1],
        fmt_bytes(t["first"]),
        fmt_bytes(t["last"]),
    )
    if t.get("growing_phase"):
        s += ", in phase '%s' (%s/step)" % (t["growing_phase"], _sb(t["phase_growth"][t["growing_phase"]]))
    if t.get("limit"):
        s += "; limit %s" % fmt_bytes(t["limit"])
        if t.get("projected_limit_step") is not None:
            s += ", reached at about step %s" % t["projected_limit_step"]
    return s


def _advice(
    att: Optional[Dict[str, Any]],
    flags: List[Dict[str, Any]],
    trends: Dict[str, Dict[str, Any]],
    rank: int,
    sigterm: bool = True,
) -> List[str]:
    out: List[str] = []
    cause = att.get("cause") if att else None
    att = att or {}
    for f in flags[:2]:
        per = f.get("periods") or {}
        only = f["only_in_kept_steps"]
        txt = (
            "rank %s, phase '%s': memory grown there is still held after %s on steps %s only; free it before "
            "the step ends (or have %s give it back)"
            % (
                rank,
                f["grown_in"],
                " -> ".join(f["sequence"]),
                ", ".join(map(str, f["kept_steps"][:6])),
                " / ".join("'%s'" % p for p in f["held_by"]) or "'%s'" % f["grown_in"],
            )
        )
        knobs = ["%s every %s steps" % (p, per[p]) for p in f["sequence"] + only if per.get(p)]
        if knobs:
            txt += (
                "; the pattern follows the periods (%s): schedule them on different steps or align the "
                "periods so the extra memory is freed before the next phase" % ", ".join(dict.fromkeys(knobs))
            )
        out.append(txt)
    for m, t in trends.items():
        if t["steady"]:
            txt = "rank %s: %s grows steadily (%s/step)" % (rank, m, fmt_bytes(t["bytes_per_step"]))
            if t.get("growing_phase"):
                txt += (
                    "; look at what phase '%s' keeps from step to step (lists of outputs/tensors, caches)"
                    % t["growing_phase"]
                )
            if t.get("limit") and t.get("projected_limit_step") is not None:
                txt += "; at this rate the limit %s is reached at step %s" % (
                    fmt_bytes(t["limit"]),
                    t["projected_limit_step"],
                )
            out.append(txt)
    if cause == "host-oom-kill":
        a = att.get("at_death") or {}
        out.append(
            "rank %s was OOM-killed in %s: peak %s vs limit %s; raising the limit only postpones the kill "
            "if memory grows every step"
            % (rank, _where(a), fmt_bytes(a.get("peak")), fmt_bytes(a.get("limit")))
        )
    elif cause == "ray-memory-monitor":
        out.append(
            "Ray's memory monitor killed rank %s: lower the memory use on its node (fewer workers per node, "
            "smaller batches) or adjust RAY_memory_usage_threshold / RAY_memory_monitor_refresh_ms" % rank
        )
    elif cause == "cuda-oom":
        c = att.get("cuda_oom") or {}
        out.append(
            "rank %s ran out of device memory in %s; compare the ledger rows before it: memory kept by "
            "earlier phases is what the failing phase could not get" % (rank, _where(c))
        )
    elif cause == "sigterm-external" and sigterm:
        out.append(
            "not an OOM: find who sent SIGTERM to rank %s (scheduler preemption, Ray stopping the actor, "
            "a user, a health check)" % rank
        )
    return out


def _interesting(per: Dict[int, Dict[str, Any]], focus: List[Any]) -> List[Any]:
    """Ranks in report order: focus first, then ranks with flags or steady growth, then the rest."""
    interesting = [r for r in focus if r in per]
    interesting += [
        r
        for r in sorted(per)
        if r not in interesting and (per[r]["kept"] or any(t["steady"] for t in per[r]["trends"].values()))
    ]
    interesting += [r for r in sorted(per) if r not in interesting]
    return interesting


def _rank_figures(a: Dict[str, Any]) -> Dict[str, Any]:
    """``ranks[str(rank)]`` of the summary: last level, limit, peak, trends."""
    metric, val, lim, pk = a["figures"]
    return {
        "metric": metric,
        "last": val,
        "limit": lim,
        "peak": pk[0] if pk else None,
        "peak_where": _where(pk[1]) if pk else None,
        "samples": len(a["samples"]),
        "trends": a["trends"],
    }


def _ledger_of(a: Dict[str, Any], max_steps: int) -> List[Dict[str, Any]]:
    """A rank's ledger rows of its newest ``max_steps`` steps (and open step-less rows)."""
    keep = set(sorted({row["step"] for row in a["rows"] if row["step"] is not None})[-max_steps:])
    return [
        {
            k: row[k]
            for k in ("rank", "step", "phase", "metric", "enter", "exit", "delta", "last", "depth", "limit")
        }
        for row in a["rows"]
        if row["step"] in keep or (row["step"] is None and row["exit"] is None)
    ]


def summarize(
    procs_by_rank: Dict[int, Any],
    focus: List[Any],
    attributions: Optional[Dict[int, Any]] = None,
    max_ranks: int = LEDGER_MAX_RANKS,
    max_steps: int = LEDGER_MAX_STEPS,
    sigterm_culprits: Optional[Set[int]] = None,
) -> Optional[Dict[str, Any]]:
    """``details['memory']`` of a diagnosis (dict) or None when nothing was sampled.

    ``procs_by_rank``: {rank: ProcessInfo}; ``focus``: ranks to report first (culprits,
    then cascade); ``attributions``: {rank: attribute() result}. Ledger rows are kept for
    at most ``max_ranks`` ranks (focus first, then ranks with flags or steady growth) and
    their newest ``max_steps`` steps. Keys: ``ranks`` {str(rank): {'last', 'peak', 'limit',
    'trends'}}, ``ledger`` [rows], ``kept_across`` [flags], ``trends`` [steady trends],
    ``attribution`` {str(rank): ...}, ``advice`` [str], ``evidence`` [str].
    ``sigterm_culprits``: the ranks whose external SIGTERM is the verdict's own cause (a
    dead-rank verdict's culprits); only they get the "find who sent SIGTERM" advice, not a
    cascade rank the launcher stopped after the root. None: every rank (no verdict yet).
    """
    attributions = attributions or {}
    per: Dict[int, Dict[str, Any]] = {}
    for r, p in procs_by_rank.items():
        if not (getattr(p, "memory", None) or any(rec.get("kind") == "memory" for rec in (p.records or ()))):
            continue
        per[r] = analyse_process(p, r)
    if not per:
        return None
    interesting = _interesting(per, focus)
    out: Dict[str, Any] = {
        "ranks": {str(r): _rank_figures(per[r]) for r in sorted(per)},
        "ledger": [],
        "kept_across": [],
        "trends": [],
        "attribution": {},
        "advice": [],
        "evidence": [],
    }
    for r in interesting[:max_ranks]:
        out["ledger"] += _ledger_of(per[r], max_steps)
    for r in interesting:
        for f in per[r]["kept"]:
            out["kept_across"].append(f)
            out["evidence"].append(_flag_text(f))
        for t in per[r]["trends"].values():
            if t["steady"]:
                out["trends"].append(dict(t, rank=r))
                out["evidence"].append(_trend_text("rank %s" % r, t))
    for r in focus:
        att = attributions.get(r)
        if att is not None:
            out["attribution"][str(r)] = {
                k: att.get(k)
                for k in (
                    "cause",
                    "base_cause",
                    "cause_text",
                    "at_death",
                    "evidence",
                    "cuda_oom",
                    "ray_memory_monitor",
                )
            }
            if att.get(
                "helper_text"
            ):  # (a DataLoader worker of the rank OOM-killed, or SIGKILLed by another)
                out["attribution"][str(r)].update(
                    helper_text=att["helper_text"], helper_kill=att.get("helper_kill")
                )
    for r in interesting[:4]:
        att = attributions.get(r)
        if (
            r in per and att is not None and att.get("cause") in MEMORY_CAUSES
        ):  # the schedule first (coincide.py)
            both = coinciding(per[r]["rows"], (att.get("at_death") or {}).get("step"), r)
            out["advice"] += [both] if both else []
        if r in per:
            out["advice"] += _advice(
                attributions.get(r),
                per[r]["kept"],
                per[r]["trends"],
                r,
                sigterm_culprits is None or r in sigterm_culprits,
            )
    out["advice"] = list(dict.fromkeys(out["advice"]))[:6]
    out["evidence"] = out["evidence"][:12]
    return out


#: Kept/grown memory below both figures is not worth a line in a verdict (allocator noise,
#: caches): at least this many bytes ...
SIGNIFICANT_BYTES = 64 * MIB


#: ... or this fraction of the limit.
SIGNIFICANT_FRACTION = 0.05


#: Death causes for which memory always matters.
MEMORY_CAUSES = ("host-oom-kill", "ray-memory-monitor", "cuda-oom")


def significant_bytes(n: Optional[float], limit: Optional[float] = None) -> bool:
    """True when ``n`` bytes kept/grown matter: >= SIGNIFICANT_BYTES or >=
    SIGNIFICANT_FRACTION of ``limit``."""
    if n is None:
        return False
    return n >= SIGNIFICANT_BYTES or bool(limit and n >= SIGNIFICANT_FRACTION * limit)


def significant(
    mem: Optional[Dict[str, Any]], cause: Any = None
) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]]]:
    """``(flags, trends)`` of a ``summarize`` result worth showing in a verdict: kept
    flags / steady trends whose bytes are significant (:func:`significant_bytes`);
    everything when ``cause`` is memory-related (MEMORY_CAUSES)."""
    if not mem:
        return [], []
    flags, trends = mem.get("kept_across") or [], mem.get("trends") or []
    if cause in MEMORY_CAUSES:
        return list(flags), list(trends)
    ranks = mem.get("ranks") or {}

    def lim(r: Any) -> Optional[int]:
        return (ranks.get(str(r)) or {}).get("limit")

    return (
        [f for f in flags if significant_bytes(f.get("bytes_kept_median"), lim(f.get("rank")))],
        [
            t
            for t in trends
            if significant_bytes(
                (t.get("last") or 0) - (t.get("first") or 0), t.get("limit") or lim(t.get("rank"))
            )
        ],
    )


def watch_lines(records: List[Any], label: str) -> List[Tuple[str, str]]:
    """Early-warning lines for the watcher: one per steadily growing metric (list of
    ``(key, line)``; ``key`` identifies the metric so the watcher warns once)."""
    ss = samples(records)
    if not ss:
        return []
    rows = ledger(ss)
    out = []
    for m in _metrics(ss):
        if not _primary(ss, m):
            continue
        t = trend(ss, rows, m)
        if t is None or not t["steady"] or t["nsteps"] < 4:
            continue
        out.append((m, "memory warning: " + _trend_text(label, t)))
    return out
