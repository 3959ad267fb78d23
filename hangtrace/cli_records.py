"""``hangtrace records RUN_DIR``: every traced process of a run and its last records."""
from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from .cli_out import dumps, err

if TYPE_CHECKING:
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
        s += " %s" % r["state"]
        if r["error"]:
            s += " (%s)" % r["error"]
    elif r["kind"] == "group":
        s = "group %s created" % r["group"]
    elif r["kind"] in ("phase_enter", "phase_exit"):
        s = "%s %s" % (r["kind"].replace("_", " "), r["phase"])
    elif r["kind"] == "event":
        s = "event %s" % r["group"]
    elif r["kind"] == "step":
        s = "step %d" % r["seq"]
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


def cmd_records(args: argparse.Namespace) -> int:
    """List every traced process of a run and its last records (every record decoded)."""
    from .tracer.pipeline import records
    snap = records(args.run_dir, log=err)
    if args.json:
        out = []
        for p in snap.processes:
            recs = p.records[-args.last:] if args.last else p.records
            out.append({"rank": p.rank, "local_rank": p.local_rank, "world_size": p.world_size,
                        "host": p.host, "pid": p.pid, "state": p.state, "exit_code": p.exit_code,
                        "phase": p.phase, "step": p.step, "inflight": p.inflight, "groups": p.groups,
                        "events": p.events, "signals": {k: {"wall_ns": v["wall_ns"], "path": v["path"]}
                                                        for k, v in p.signals.items()},
                        "meta": p.meta, "records": recs})
        print(dumps({"run_dir": snap.run_dir, "processes": out, "errors": snap.errors}))
        return 0
    for p in snap.processes:
        print("rank %s  %s:%d  %s  phase=%s step=%s" % (p.rank if p.rank >= 0 else "?", p.host, p.pid,
                                                       _fmt_state(p), p.phase, p.step))
        if p.inflight:
            print("  in flight: %s" % _fmt_record(p.inflight))
        for k, v in p.signals.items():
            print("  %s stacks written: %s" % (k, v["path"]))
        for e in p.events:
            if e.get("event") in ("exception", "thread_exception"):
                print("  %s: %s: %s" % (e["event"], e.get("type"), e.get("message")))
        recs = p.records[-args.last:] if args.last else p.records
        for r in recs:
            print("  #%d %s" % (r["idx"], _fmt_record(r)))
    for line in snap.errors:
        print("error: %s" % line)
    return 0


def add_parser(sub: Any) -> None:
    """Register ``records`` on the subcommand parsers ``sub`` of ``cli.build_parser``."""
    rc = sub.add_parser("records", help="list traced processes and their last records")
    rc.add_argument("run_dir")
    rc.add_argument("--json", action="store_true")
    rc.add_argument("--last", type=int, default=20, help="records per process (0 = all)")
    rc.set_defaults(fn=cmd_records)
