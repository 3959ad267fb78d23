"""``hangtrace analyze | dump | attach``: a diagnosis of a run directory or snapshot
(offline), of a live run (now), or of a job not started with hangtrace (its stacks).
Parsed arguments in; the verdict paragraph (or the diagnosis as JSON) on stdout, the
exit code out."""

from __future__ import annotations

import argparse
import gc
import os
from typing import TYPE_CHECKING, Any

from .cli_args import positive_float
from .cli_out import dumps as _dumps
from .cli_out import err as _err
from .tracer import config
from .tracer.errors import RunDirError

if TYPE_CHECKING:
    from .tracer.pipeline import Result


# --- analyze / dump / attach -------------------------------------------------------------
def _print_diag(res: "Result", as_json: bool) -> None:
    from .tracer.report.text import diagnosis_json

    snap = res.snapshot
    if as_json:
        d = diagnosis_json(res.diagnosis)
        d["snapshot"] = snap.path
        print(_dumps(d))
    else:
        print(res.paragraph)
        if snap.path:
            print("\nreport: %s" % os.path.join(snap.path, "report.txt"))
        for e in snap.errors:
            print("note: %s" % e)


def cmd_analyze(args: argparse.Namespace) -> int:
    """Offline analysis of a run directory (newest snapshot, else the rings) or a snapshot."""
    from .tracer.pipeline import diagnose_path, diagnose_paths

    # The analysis allocates millions of objects (records, samples, Flight Recorder entries)
    # that live until it ends, and makes little cyclic garbage: CPython's cycle collector
    # walked all of them again at each of its full passes, a cost that grows with the heap
    # (issue 40, 512 ranks of real rings: 19.3 s user + 16.5 s system CPU with it, 10.9 +
    # 1.6 without, the same peak RSS). This command is a process of its own, which exits.
    gc.disable()
    try:
        if len(args.path) > 1:  # issue 39: node-local run directories of several nodes of one job
            _print_diag(diagnose_paths(args.path, log=_err, stall_s=args.stall_s), args.json)
            return 0
        _print_diag(diagnose_path(args.path[0], log=_err, stall_s=args.stall_s), args.json)
        return 0
    finally:
        gc.enable()


def cmd_dump(args: argparse.Namespace) -> int:
    """Snapshot and diagnose a live run now; the job keeps running."""
    from .tracer import pipeline

    stall_s = args.stall_s if args.stall_s is not None else config.get_float(config.STALL_S)
    if getattr(args, "ray", False):  # issue 4: every alive node of a Ray cluster
        res = pipeline.dump_ray(args.run_dir, args.address, native=args.native, stall_s=stall_s)
        if not args.json:
            _err(
                "collected %d process(es) from %d Ray node(s) into %s"
                % (len(res.snapshot.processes), len(res.snapshot.ray_nodes), res.snapshot.path)
            )
        _print_diag(res, args.json)
        return 0
    run_dir = args.run_dir or os.environ.get(config.DIR)
    if not run_dir:
        raise RunDirError("no run directory given", "pass RUN_DIR, or set HANGTRACE_DIR")
    pipeline.require_dir(run_dir)  # (a mistyped path: no snapshot folder made there)
    from .tracer.watch.progress import DEFAULT_WINDOW_S

    window_s = DEFAULT_WINDOW_S if args.window is None else args.window
    from .tracer.watch.jobwatch import dump_job

    res = dump_job(  # issue 39: on one node of several, every node's summary, one job-wide verdict
        run_dir,
        lambda kind: pipeline.dump_live(
            run_dir, kind, native=args.native, stall_s=stall_s, window_s=window_s
        ),
        log=_err,
        stall_s=stall_s,
    )
    _print_diag(res, args.json)
    return 0


def cmd_attach(args: argparse.Namespace) -> int:
    """Stacks of a hung job that was not started with hangtrace; names the outliers."""
    if args.list:
        from .tracer.collect.attach import list_jobs

        jobs = list_jobs()
        print("\n".join(jobs) if jobs else "no torch.distributed job found on this host")
        return 0 if jobs else 5
    from .tracer.pipeline import attach

    _print_diag(attach(args.pid or None, native=args.native, log=_err, window_s=args.window), args.json)
    return 0


def add_parsers(sub: Any) -> None:
    """Register ``dump``, ``analyze`` and ``attach`` on the subcommand parsers ``sub`` of
    ``cli.build_parser``."""
    d = sub.add_parser("dump", help="snapshot and diagnose a live run now")
    d.add_argument("run_dir", nargs="?", default=None)
    d.add_argument("--json", action="store_true")
    d.add_argument("--native", action="store_true")
    d.add_argument(
        "--stall-s",
        type=positive_float,
        default=None,
        help="seconds without progress after which the run counts as stalled (default "
        "HANGTRACE_STALL_S, else 300); pass the run's own --stall-s",
    )
    d.add_argument(
        "--window",
        type=positive_float,
        default=None,
        metavar="SECONDS",
        help="judge the job over this many seconds (at least 1; default 2): the ring "
        "headers are read before and after the snapshot, and the job counts as hung only when no "
        "process made progress between the two readings (one instant catches healthy ranks "
        "milliseconds apart)",
    )
    d.add_argument(
        "--ray",
        action="store_true",
        help="collect on every alive node of a Ray cluster (tasks pinned to each node)",
    )
    d.add_argument(
        "--address",
        default=None,
        help="with --ray: Ray cluster (GCS) address (default RAY_ADDRESS, else the "
        "run's own cluster from its workers' records, else 'auto'); token auth: "
        "docs/RAY.md",
    )
    d.set_defaults(fn=cmd_dump)

    a = sub.add_parser(
        "analyze",
        help="diagnose a run directory or snapshot offline",
        description="Diagnose offline: the newest snapshot of RUN_DIR, "
        "a snapshot folder RUN_DIR/snapshots/<time>, the rings as they are, "
        "or a directory of torch Flight Recorder dumps. Prints the verdict paragraph; writes nothing. "
        "Several directories: the node-local run directories of one job's nodes, copied from "
        "them, analysed as one job (docs/MULTINODE.md).",
    )
    a.add_argument(
        "path",
        nargs="+",
        metavar="RUN_DIR|SNAPSHOT",
        help="the run directory `hangtrace run` printed (HANGTRACE_DIR of the job), one of its "
        "snapshots, or a directory of comm_lib_trace_rank_<r> dumps; several: one per node of a job",
    )
    a.add_argument(
        "--stall-s",
        type=float,
        default=None,
        help="seconds without progress that make a stall, for a snapshot not taken at one "
        "(default: the --stall-s the run was started with, from its processes' environment "
        "records, else 300)",
    )
    a.add_argument(
        "--json",
        action="store_true",
        help="the whole diagnosis as JSON (schema 1, docs/DIAGNOSIS.md): kind, cause, culprit "
        "ranks and actors, group/seq/op, frames, evidence, cascade, details",
    )
    a.set_defaults(fn=cmd_analyze)

    t = sub.add_parser("attach", help="diagnose a hung torch.distributed job not started with hangtrace")
    t.add_argument(
        "--pid",
        type=int,
        action="append",
        help="process id (repeat); default: the "
        "torch.distributed job you started most recently (named on stderr, with the reason)",
    )
    t.add_argument("--json", action="store_true")
    t.add_argument(
        "--window",
        type=float,
        default=None,
        metavar="SECONDS",
        help="seconds between the two stack samples (default 1; 0: one sample): stacks that "
        "change between them are a working job, not a hung one",
    )
    t.add_argument("--native", action="store_true")
    t.add_argument(
        "--list",
        action="store_true",
        help="list the torch.distributed jobs on this host, newest "
        "first, with their pids and owners, and exit (to choose --pid on a shared machine)",
    )
    t.set_defaults(fn=cmd_attach)
