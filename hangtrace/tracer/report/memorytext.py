"""The memory sentences of a verdict paragraph (issue 5): attribution figures, memory kept
across phases, trends and the holders Ray's memory monitor freed (pure; the figures come
from ``analyze/memory``, docs/MEMORY.md). Split from ``paragraph.py``."""

from __future__ import annotations

from typing import Optional

from hangtrace.tracer.diagnosis import Diagnosis


# --- memory (issue 5): attribution figures, kept-across flags, trends, the ledger ---
def fb(n: Optional[int]) -> str:
    """Bytes as text (analyze.memory.fmt_bytes)."""
    from hangtrace.tracer.analyze.memory import fmt_bytes

    return fmt_bytes(n)


def memory_text(diag: Diagnosis) -> str:
    mem = (diag.details or {}).get("memory") or {}
    if not mem:
        return ""
    out = ""
    for r in diag.culprit_ranks[:2]:
        a = (mem.get("attribution") or {}).get(str(r)) or {}
        if a.get("helper_text"):  # a DataLoader worker of the rank OOM-killed (analyze/memory/attribution.py)
            out += " Rank %s: %s." % (r, a["helper_text"])
        at = a.get("at_death") or {}
        if at.get("limit") and (at.get("cgroup_usage") is not None or at.get("rss") is not None):
            v = at.get("cgroup_usage") if at.get("cgroup_usage") is not None else at.get("rss")
            out += " Memory (rank %s): %s of limit %s at its last sample (%s%s), peak %s." % (
                r,
                fb(v),
                fb(at["limit"]),
                "phase '%s', " % at["phase"] if at.get("phase") else "",
                "step %s" % at.get("step"),
                fb(at.get("peak")),
            )
    from hangtrace.tracer.analyze.memory import significant

    flags, trends = significant(mem, diag.cause)  # small kept/grown bytes: text report only
    for f in flags[:1]:
        out += (
            " Memory kept across phases (rank %s): %s of %s kept across %s on step%s %s, released on "
            "step%s %s."
            % (
                f["rank"],
                fb(f["bytes_kept_median"]),
                f["metric"],
                " -> ".join(f["sequence"]),
                "s" if len(f["kept_steps"]) > 1 else "",
                ", ".join(map(str, f["kept_steps"][:6])),
                "s" if len(f["released_steps"]) > 1 else "",
                ", ".join(map(str, f["released_steps"][:6])),
            )
        )
    for t in trends[:1]:
        out += " Memory growth (rank %s): %s +%s/step%s%s." % (
            t["rank"],
            t["metric"],
            fb(t["bytes_per_step"]),
            " in phase '%s'" % t["growing_phase"] if t.get("growing_phase") else "",
            "; limit %s reached at about step %s" % (fb(t["limit"]), t["projected_limit_step"])
            if t.get("projected_limit_step") is not None
            else "",
        )
    adv = mem.get("advice") or []
    if adv and (flags or trends or diag.cause in ("host-oom-kill", "ray-memory-monitor", "cuda-oom")):
        out += " Memory advice: %s." % adv[0]
    return out


def holders_text(diag: Diagnosis) -> str:
    """Ray's memory monitor: the killed process and who held the memory (issue 9)."""
    mh = (diag.details or {}).get("memory_holders") or {}
    k = mh.get("killed") or {}
    if not k:
        return ""
    every = mh.get("holders") or []
    hs = [h for h in every if k.get("rss") is None or h["rss"] > k["rss"]]
    if not hs:
        return " Ray's memory monitor killed %s (%s), %s." % (
            k.get("label"),
            "RSS %s" % fb(k["rss"]) if k.get("rss") is not None else "memory unknown",
            "the largest holder of the job we sampled" if every else "no other process's memory was sampled",
        )
    return " Ray's memory monitor killed %s (%s), not the largest holder: the memory was held by %s." % (
        k.get("label"),
        "RSS %s" % fb(k["rss"]) if k.get("rss") is not None else "memory unknown",
        ", ".join(
            "%s (%s%s)"
            % (h["label"], "" if str(h["label"]).startswith("pid ") else "pid %s, " % h["pid"], fb(h["rss"]))
            for h in hs[:2]
        ),
    )
