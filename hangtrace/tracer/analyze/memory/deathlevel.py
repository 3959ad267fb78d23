"""A dead process's memory level at death, and the OOM facts gathered at collection (pure).

In: a ProcessInfo (its ``memory_facts``: kernel OOM line, cgroup oom_kill counter, host
memory) and its memory samples (``samples.samples``). Out: a frozen :class:`_Level` (its
last host sample, the metric and value against the limit in bytes, ``frac`` = value /
limit, the OOM facts, a sentence on the level) and the ``at_death`` dict of an
attribution (:func:`_level_of`). Read by ``attribution`` (the rank) and ``helperdeaths``
(its DataLoader workers).
"""

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from hangtrace.tracer.analyze.memory.samples import _last_host, _level, _peak, _where, fmt_bytes


def _pct(v: Optional[float], lim: Optional[float]) -> str:
    return "%d%%" % round(100.0 * v / lim) if v is not None and lim else "?"


@dataclass(frozen=True)
class _Level:
    """A dead process's memory at its last host sample and the OOM facts gathered at
    collection (bytes; ``frac``: value / limit)."""

    h: Optional[Dict[str, Any]]
    metric: Optional[str]
    val: Optional[int]
    lim: Optional[int]
    frac: Optional[float]
    facts: Dict[str, Any]
    kern: Optional[Dict[str, Any]]
    now_ctr: Optional[int]
    last_ctr: Optional[int]
    mem_line: Optional[str]

    @property
    def ctr_up(self) -> bool:
        """The cgroup's oom_kill counter rose after the last sample."""
        return self.now_ctr is not None and self.last_ctr is not None and self.now_ctr > self.last_ctr

    @property
    def ctr_same(self) -> bool:
        """The cgroup's oom_kill counter is unchanged since the last sample."""
        return self.now_ctr is not None and self.last_ctr is not None and self.now_ctr == self.last_ctr


def _level_of(proc: Any, ss: List[Dict[str, Any]]) -> Tuple[_Level, Dict[str, Any]]:
    """The memory level at death and the ``at_death`` dict."""
    facts = getattr(proc, "memory_facts", None) or {}
    h = _last_host(ss)
    metric, val, lim = _level(h)
    frac = (float(val) / lim) if val is not None and lim else None
    at: Dict[str, Any] = {}
    mem_line = None
    if h is not None:
        at = {
            "t_wall_ns": h["t_wall_ns"],
            "phase": h["phase"],
            "step": h["step"],
            "rss": h["values"].get("rss"),
            "cgroup_usage": h["values"].get("cgroup"),
            "limit": lim,
            "oom_kills": h.get("oom_kills"),
            "swap": h.get("swap"),
            "fraction_of_limit": round(frac, 3) if frac is not None else None,
        }
        pk = _peak(ss, metric) if metric else None
        if pk:
            at["peak"] = pk[0]
            at["peak_where"] = _where(pk[1])
        if lim:
            mem_line = "%s %s of limit %s (%s) at its last sample (%s)" % (
                "cgroup usage" if metric == "cgroup" else "RSS",
                fmt_bytes(val),
                fmt_bytes(lim),
                _pct(val, lim),
                _where(h),
            )
        else:
            total = facts.get("host_mem_total")
            mem_line = "RSS %s at its last sample (%s); no memory limit on its cgroup%s" % (
                fmt_bytes(h["values"].get("rss")),
                _where(h),
                ", host memory %s" % fmt_bytes(total) if total else "",
            )
    lv = _Level(
        h,
        metric,
        val,
        lim,
        frac,
        facts,
        facts.get("kernel_oom"),
        facts.get("cgroup_oom_kill_now"),
        h.get("oom_kills") if h else None,
        mem_line,
    )
    return lv, at
