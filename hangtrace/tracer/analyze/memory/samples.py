"""Memory samples (from the K_MEM ring records) and the small helpers over them: bytes
formatting, the host sample, peaks, levels against the limit, thresholds (pure).

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

from hangtrace.tracer.ring import layout as F

#: one memory sample (see the module docstring)
Sample = Dict[str, Any]


#: memory at or above this fraction of the limit is "near the limit"
NEAR = 0.90


#: below this fraction it is "well below the limit"
LOW = 0.75


MIB = 1 << 20


_SRC = {i: n for i, n in enumerate(F.MEM_SOURCES)}


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


def _v(x: Optional[float]) -> Optional[int]:
    return None if x is None or x < 0 else int(x)


def _source(op: Any) -> str:
    if isinstance(op, int):
        return _SRC.get(op, str(op))
    i = F.OP_IDS.get(op)
    if i is None:
        try:
            i = int(op)
        except (TypeError, ValueError):
            return str(op)
    return _SRC.get(i, str(op))


def samples(records: Optional[List[Any]]) -> List[Sample]:
    """Memory samples (dicts, see module doc) of a record list, in record order."""
    out = []
    for r in records or ():
        if r.get("kind") != "memory":
            continue
        a = tuple(r.get("a") or (-1, -1, -1, -1, -1))
        what = r.get("what") or r.get("group") or "?"  # MemorySample; older dicts: group/op
        src = _source(r.get("source") or r.get("op"))
        s = {
            "t_wall_ns": r.get("t_wall_ns") or 0,
            "source": src,
            "what": what,
            "phase": r.get("phase"),
            "step": r.get("step"),
            "thread": r.get("thread"),
            "values": {},
            "limits": {},
            "oom_kills": None,
            "swap": None,
            "raw": a,
        }
        if what == "host":
            rss, swap, usage, limit, oom = a
            if _v(rss) is not None:
                s["values"]["rss"] = rss
            if _v(usage) is not None:
                s["values"]["cgroup"] = usage
                if limit and limit > 0:
                    s["limits"]["cgroup"] = limit
            s["swap"], s["oom_kills"] = _v(swap), _v(oom)
            s["limit"] = limit if limit and limit > 0 else (0 if limit == 0 else None)
        elif what.startswith("cuda:"):
            if src == "oom":
                s["requested"], s["device_allocated"], s["device_free"] = _v(a[0]), _v(a[1]), _v(a[3])
                s["device_total"] = _v(a[4])
            else:
                for name, x in (("allocated", a[0]), ("reserved", a[1])):
                    if _v(x) is not None:
                        s["values"]["%s %s" % (what, name)] = x
                        if a[4] and a[4] > 0:
                            s["limits"]["%s %s" % (what, name)] = a[4]
                s["peak"], s["device_free"], s["device_total"] = _v(a[2]), _v(a[3]), _v(a[4])
        elif what.startswith("gauge:"):
            if _v(a[0]) is not None:
                s["values"][what] = a[0]
                if a[1] and a[1] > 0:
                    s["limits"][what] = a[1]
        out.append(s)
    return out


def _host(ss: List[Sample]) -> List[Sample]:
    return [s for s in ss if s["what"] == "host"]


def _last_host(ss: List[Sample]) -> Optional[Sample]:
    for s in reversed(ss):
        if s["what"] == "host":
            return s
    return None


def _peak(ss: List[Sample], metric: str) -> Optional[Tuple[int, Sample]]:
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


def _metrics(ss: List[Sample]) -> List[str]:
    ms = []
    for s in ss:
        for m in s["values"]:
            if m not in ms:
                ms.append(m)
    return ms


def _primary(ss: List[Sample], metric: str) -> bool:
    """Metrics worth a per-rank trend: rss, CUDA, gauges. Never the cgroup usage: the
    cgroup is usually shared by every rank of a container, so its growth is not one rank's
    (it is only compared against its limit, see :func:`attribute`)."""
    return metric != "cgroup"


def _thr(values: Sequence[Optional[float]]) -> int:
    """Noise threshold (bytes): max(1 MiB, 1 % of the largest absolute value)."""
    peak = max([abs(v) for v in values if v is not None] or [0])
    return max(MIB, int(0.01 * peak))
