"""Small helpers over memory samples (``tracer/ring/memsamples.py`` decodes them from the
ring; the dict layout is documented there): bytes formatting, the host sample, peaks,
levels against the limit, thresholds (pure).

Sample dicts::

    {"t_wall_ns", "source": 'timer'|'phase_enter'|'phase_exit'|'step'|'oom',
     "what": 'host'|'cuda:N'|'gauge:<name>', "phase", "step", "thread",
     "values": {metric: bytes}, "limits": {metric: bytes}, "oom_kills": int|None,
     "swap": int|None}

Metrics: ``rss`` and ``cgroup`` (usage, limited by the cgroup limit) from 'host';
``cuda:N allocated`` / ``cuda:N reserved`` (limit: device total); ``gauge:<name>``
(limit: the registered budget). Bytes are ints; times are ns since the Unix epoch.
"""

from typing import Any, Dict, List, Optional, Sequence, Tuple

from hangtrace.tracer.ring.memsamples import Sample


#: memory at or above this fraction of the limit is "near the limit"
NEAR = 0.90


#: below this fraction it is "well below the limit"
LOW = 0.75


MIB = 1 << 20


def fmt_bytes(n: Optional[float]) -> str:
    """1536 -> '1.5 KiB'; None/negative -> '?'."""
    if n is None or n < 0:
        return "?"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return ("%d %s" % (n, unit)) if unit == "B" else ("%.1f %s" % (n, unit))
        n /= 1024.0
    return "?"


def _sb(n: Optional[float]) -> str:
    """Signed bytes: '+20.0 MiB' / '-1.0 GiB'."""
    if n is None:
        return "?"
    return ("+" if n >= 0 else "-") + fmt_bytes(abs(n))


def _host(ss: Sequence[Sample]) -> List[Sample]:
    return [s for s in ss if s["what"] == "host"]


def _last_host(ss: Sequence[Sample]) -> Optional[Sample]:
    for s in reversed(ss):
        if s["what"] == "host":
            return s
    return None


def _peak(ss: Sequence[Sample], metric: str) -> Optional[Tuple[int, Sample]]:
    best = None
    for s in ss:
        v = s["values"].get(metric)
        if v is not None and (best is None or v > best[0]):
            best = (v, s)
    return best


def _level(h: Optional[Sample]) -> Tuple[Optional[str], Optional[int], Optional[int]]:
    """(metric, value, limit) judging a host sample against its limit."""
    if h is None:
        return None, None, None
    lim = h.get("limit")
    if "cgroup" in h["values"] and lim:
        return "cgroup", h["values"]["cgroup"], lim
    return "rss", h["values"].get("rss"), lim or None


def _where(s: Dict[str, Any]) -> str:
    parts = []
    if s.get("phase"):
        parts.append("phase '%s'" % s["phase"])
    if s.get("step") is not None:
        parts.append("step %s" % s["step"])
    return ", ".join(parts) or "no phase"


def _metrics(ss: Sequence[Sample]) -> List[str]:
    ms = []
    for s in ss:
        for m in s["values"]:
            if m not in ms:
                ms.append(m)
    return ms


def _primary(ss: Sequence[Sample], metric: str) -> bool:
    """Metrics worth a per-rank trend: rss, CUDA, gauges. Never the cgroup usage: the
    cgroup is usually shared by every rank of a container, so its growth is not one rank's
    (it is only compared against its limit, see :func:`attribute`)."""
    return metric != "cgroup"


def _thr(values: Sequence[Optional[float]]) -> int:
    """Noise threshold (bytes): max(1 MiB, 1 % of the largest absolute value)."""
    peak = max([abs(v) for v in values if v is not None] or [0])
    return max(MIB, int(0.01 * peak))
