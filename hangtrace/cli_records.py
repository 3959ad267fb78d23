"""``hangtrace records RUN_DIR``: every traced process of a run and its last records.

Memory samples (kind ``memory``: every ``HANGTRACE_MEM_INTERVAL_S``, at every phase
boundary and step) would bury the collectives, phases and lifecycle records, so they are
left out unless ``--memory`` is given; out-of-memory samples (source ``oom``) are events and
always shown. ``--last N`` counts the records shown. Each record line gives its wall time
(local time of day, ms) and a completed collective how long it took.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any, List, Optional, Tuple

from .cli_out import dumps, err

if TYPE_CHECKING:
    from .tracer.process_model import ProcessRoles
    from .tracer.snapshot import ProcessInfo


def _fmt_state(p: "ProcessInfo") -> str:
    if p.state == "exited":
        return "exited(%s)" % p.exit_code
    return p.state


def _fmt_record(r: Any) -> str:
    if r["kind"] in ("collective", "p2p"):
        s = "%s %s group=%s seq=%d" % (r["kind"], r["op"], r["group"], r["seq"])
        if r["numel"] or r["dtype"]:
            s += " %s[%s]" % (r["dtype"], r["shape"] or r["numel"])
        if r["peer"] >= 0:
            s += " peer=%d" % r["peer"]
        if r["async_op"]:
            s += " async"
        s += " %s%s" % (r["state"], _took(r))
        if r["error"]:
            s += " (%s)" % r["error"]
    elif r["kind"] == "group":
        s = "group %s created" % r["group"]
    elif r["kind"] in ("phase_enter", "phase_exit"):
        s = "%s %s" % (r["kind"].replace("_", " "), r["phase"])
        if r["state"] == "failed":  # (the exception that left it: a Ray actor method's, caught by Ray)
            s += " failed (%s)" % (r["error"] or "")
    elif r["kind"] == "event":
        s = "event %s" % r["group"]
    elif r["kind"] == "step":
        s = "step %d" % r["seq"]
    elif r["kind"] == "memory":
        s = _fmt_memory(r)
    elif r["kind"] == "ray_wait":
        s = _fmt_wait(r)
    else:
        s = r["kind"]
    ctx = []
    if r["phase"]:
        ctx.append("phase=%s" % r["phase"])
    if r["step"] is not None:
        ctx.append("step=%d" % r["step"])
    if r["thread"] and r["thread"] != "MainThread":
        ctx.append("thread=%s" % r["thread"])
    return "%s%s" % (s, ("  [" + " ".join(ctx) + "]") if ctx else "")


def _clock(wall_ns: Any) -> str:
    """``06:34:04.111``: a record's wall time (``t_wall_ns``, Unix ns) as local time of
    day, ms; ``--:--:--.---`` when the record has none."""
    import time

    if not isinstance(wall_ns, int) or wall_ns <= 0:
        return "--:--:--.---"
    return "%s.%03d" % (time.strftime("%H:%M:%S", time.localtime(wall_ns // 10**9)), wall_ns // 10**6 % 1000)


def _took(r: Any) -> str:
    """`` in 12.3 ms``: how long a completed collective or p2p took, from its issue and
    completion times (same host's CLOCK_MONOTONIC, ns); empty for other records."""
    end, start = r.get("t_end_mono_ns"), r.get("t_mono_ns")
    if r.get("kind") not in ("collective", "p2p") or not end or not start or end < start:
        return ""
    d = (end - start) / 1e9
    return " in %.3g s" % d if d >= 1 else " in %.3g ms" % (d * 1e3)


def _fmt_wait(r: Any) -> str:
    """``ray.get on RewardServer.score (actor 1a2b3c4d) issued``: a Ray wait record."""
    try:
        d = json.loads(r["group"] or "{}")
        what = ", ".join(
            "%s.%s (actor %s)" % (t.get("class") or "?", t.get("method"), str(t.get("actor_id"))[:8])
            for t in d.get("targets") or ()
        )
        s = "%s on %s%s" % (
            "await" if d.get("api") == "await" else "ray.%s" % d.get("api"),
            what,
            " and %d more" % d["more"] if d.get("more") else "",
        )
    except (ValueError, TypeError, AttributeError):
        s = "ray wait %s" % r["group"]
    return "%s %s%s" % (s, r["state"], " (%s)" % r["error"] if r["error"] else "")


#: names of a memory sample's five values, by what was sampled (``ring/layout.py``)
_MEM_FIELDS = {
    "host": ("rss", "swap", "cgroup", "cgroup_limit", "oom_kills"),
    "cuda": ("allocated", "reserved", "peak", "free", "total"),
    "gauge": ("value", "limit"),
}


def _fmt_memory(r: Any) -> str:
    """``memory host (timer) rss=1.2 GiB swap=0 B ...``; unknown values (-1) left out."""
    from .tracer.analyze.memory.samples import fmt_bytes

    what = str(r["what"])
    names = _MEM_FIELDS.get(what.split(":", 1)[0], ())
    if r["source"] == "oom" and what.startswith("cuda"):  # from the allocator's observer
        names = ("requested", "allocator", "", "free", "total")
    vals = []
    for name, v in zip(names, r["a"]):
        if v < 0 or not name or (name in ("cgroup_limit", "limit") and v == 0):
            continue
        vals.append("%s=%s" % (name, v if name == "oom_kills" else fmt_bytes(v)))
    return "memory %s (%s)%s" % (what, r["source"], (" " + " ".join(vals)) if vals else "")


def shown(recs: List[Any], memory: bool, last: int) -> Tuple[List[Any], int]:
    """The records ``records`` shows of one process: memory samples only when ``memory``
    (an out-of-memory sample always), then the newest ``last`` (0 = all). Returns them and
    how many memory samples were left out."""
    keep = recs if memory else [r for r in recs if r["kind"] != "memory" or r.get("source") == "oom"]
    hidden = len(recs) - len(keep)
    return (keep[-last:] if last else keep), hidden


def who(p: "ProcessInfo", roles: "ProcessRoles") -> Tuple[str, Optional[int]]:
    """``('rank 1', None)``, ``('helper of rank 1', 1)``, ``('launcher', None)``: what the
    process is by the process model (``process_model.assign_roles``), not by the RANK it
    inherited, and the rank it helps."""
    from .tracer.process_model import process_argv
    from .tracer.snapshot import Role

    role = roles.role(p)
    if role == Role.RANK:
        return "rank %d" % p.rank, None
    helps = roles.helper_of.get(p.key)
    label = "helper of rank %d" % helps if helps is not None else role.value
    meta = p.meta or {}
    if role == Role.RAY_ACTOR and meta.get(
        "ray_actor_class"
    ):  # (blind helper 60: which pid is the RewardServer)
        label += " %s%s" % (
            meta["ray_actor_class"],
            " '%s'" % meta["ray_actor_name"] if meta.get("ray_actor_name") else "",
        )
        return label, helps
    argv = " ".join(process_argv(p))
    return label + ("  [%s]" % (argv if len(argv) <= 80 else argv[:80] + "...") if argv else ""), helps


def cmd_records(args: argparse.Namespace) -> int:
    """List every traced process of a run and its last records (every record decoded)."""
    from .tracer.pipeline import records
    from .tracer.process_model import assign_roles

    snap = records(args.run_dir, log=err)
    roles = assign_roles(snap.processes)
    if args.json:
        out = []
        for p in snap.processes:
            recs, hidden = shown(p.records, args.memory, args.last)
            out.append(
                {
                    "role": roles.role(p).value,
                    "helper_of": roles.helper_of.get(p.key),
                    "rank": p.rank,
                    "local_rank": p.local_rank,
                    "world_size": p.world_size,
                    "host": p.host,
                    "pid": p.pid,
                    "state": p.state,
                    "exit_code": p.exit_code,
                    "phase": p.phase,
                    "step": p.step,
                    "inflight": p.inflight,
                    "groups": p.groups,
                    "events": p.events,
                    "signals": {
                        k: {x: v[x] for x in ("wall_ns", "path", "sender") if x in v}
                        for k, v in p.signals.items()
                    },
                    "meta": p.meta,
                    "records": recs,
                    "memory_samples_hidden": hidden,
                }
            )
        print(dumps({"run_dir": snap.run_dir, "processes": out, "errors": snap.errors}))
        return 0
    for p in snap.processes:
        label, _helps = who(p, roles)
        print("%s  %s:%d  %s  phase=%s step=%s" % (label, p.host, p.pid, _fmt_state(p), p.phase, p.step))
        if p.inflight:
            print("  in flight since %s: %s" % (_clock(p.inflight.get("t_wall_ns")), _fmt_record(p.inflight)))
        for k, v in p.signals.items():
            snd = v.get("sender")
            print(
                "  %s stacks written: %s%s"
                % (k, v["path"], "  (sent by pid %s: %s)" % (snd["pid"], snd.get("cmdline")) if snd else "")
            )
        for e in p.events:
            if e.get("event") in ("exception", "thread_exception"):
                print("  %s: %s: %s" % (e["event"], e.get("type"), e.get("message")))
        recs, hidden = shown(p.records, args.memory, args.last)
        for r in recs:
            print("  #%d %s %s" % (r["idx"], _clock(r.get("t_wall_ns")), _fmt_record(r)))
        if hidden:
            print(
                "  (%d memory sample%s not shown: --memory shows them)" % (hidden, "" if hidden == 1 else "s")
            )
    for line in snap.errors:
        print("error: %s" % line)
    return 0


def add_parser(sub: Any) -> None:
    """Register ``records`` on the subcommand parsers ``sub`` of ``cli.build_parser``."""
    rc = sub.add_parser("records", help="list traced processes and their last records")
    rc.add_argument("run_dir")
    rc.add_argument("--json", action="store_true")
    rc.add_argument("--last", type=int, default=20, help="records shown per process (0 = all)")
    rc.add_argument(
        "--memory",
        action="store_true",
        help="include the memory samples (taken every "
        "HANGTRACE_MEM_INTERVAL_S and at phase boundaries and steps); default: only "
        "out-of-memory samples",
    )
    rc.set_defaults(fn=cmd_records)
