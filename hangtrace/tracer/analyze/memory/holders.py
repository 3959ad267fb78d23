"""Who held the memory when Ray's memory monitor killed a worker (pure; issue 9).

Ray's memory monitor kills by its policy (the newest task, a group's last worker), not the
process that holds the memory (OpenRLHF #936: the small reward model died while the
rollout's cache filled the node). The verdict names both: the killed process and the
job's largest holders at the kill, from

* our memory samples: each traced process's last host sample (RSS, bytes) at or before
  the kill plus ``SAMPLE_SLACK_NS`` and not older than ``MAX_AGE_NS`` (processes sample
  once a second);
* Ray's record of the decision (``collect/ray/raylogs.RayOomKill`` in the killed process's
  ``memory_facts['ray_oom_kill']``): the workers it considered with their memory, and of
  the node's top memory users those larger than every process of the job we sampled;
  matched to our processes by pid.

Bytes are ints, times ns since the epoch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

from hangtrace.tracer.ring.memsamples import samples

#: a sample taken up to this long after the kill time still counts (the kill time is a
#: lower bound for a death without a record; samples come once a second)
SAMPLE_SLACK_NS = 1_500_000_000
#: samples older than this before the kill say nothing of the memory at the kill
MAX_AGE_NS = 10_000_000_000
#: holders named at most
MAX_HOLDERS = 3


@dataclass(frozen=True)
class Holder:
    """One process holding memory at the kill: ``key`` 'host:pid' ('' when it is not
    traced: from Ray's top list only), ``label`` how the verdict names it, ``rss`` bytes,
    ``source`` 'samples' (ours) or 'ray' (Ray's record)."""

    key: str
    pid: int
    label: str
    rss: int
    source: str

    def to_dict(self) -> Dict[str, Any]:
        return {
            "process": self.key or None,
            "pid": self.pid,
            "label": self.label,
            "rss": self.rss,
            "source": self.source,
        }


def _rss_at(proc: Any, at_ns: int) -> Optional[int]:
    ss = getattr(proc, "memory", None) or samples(getattr(proc, "records", None))
    best = None
    for s in ss:
        t = int(s.get("t_wall_ns") or 0)
        rss = (s.get("values") or {}).get("rss")
        if s.get("what") == "host" and rss is not None and at_ns - MAX_AGE_NS <= t <= at_ns + SAMPLE_SLACK_NS:
            if best is None or t >= best[0]:
                best = (t, int(rss))
    return best[1] if best else None


def holders(
    processes: Sequence[Any],
    at_ns: int,
    killed_key: str,
    label: Callable[[Any], str],
    ray_kill: Optional[Any] = None,
) -> List[Holder]:
    """The largest memory holders at ``at_ns`` other than the killed process, largest
    first (at most MAX_HOLDERS): our samples first, then the processes Ray's record
    (``ray_kill``: a RayOomKill) names that we did not sample. ``label(proc)`` names a
    traced process."""
    out: Dict[int, Holder] = {}
    by_pid = {p.pid: p for p in processes}
    for p in processes:
        if p.key == killed_key:
            continue
        rss = _rss_at(p, at_ns)
        if rss:
            out[p.pid] = Holder(p.key, p.pid, label(p), rss, "samples")
    killed_pid = next((p.pid for p in processes if p.key == killed_key), -1)
    if ray_kill is not None:
        ours = max([h.rss for h in out.values()] or [0])
        ray = [(w.pid, w.memory, w.task_name, True) for w in ray_kill.workers]
        ray += [(pid, mem, what, False) for pid, mem, what in ray_kill.top]
        for pid, mem, what, considered in ray:
            # the workers Ray weighed; of its node-wide top list only what outweighs the job's
            if pid == killed_pid or pid in out or not mem or (not considered and mem <= ours):
                continue
            p = by_pid.get(pid)
            out[pid] = Holder(
                p.key if p is not None else "", pid, label(p) if p is not None else what, mem, "ray"
            )
    return sorted(out.values(), key=lambda h: -h.rss)[:MAX_HOLDERS]
