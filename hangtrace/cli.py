"""``hangtrace`` command line: run | dump | analyze | attach | records | timeline | env | env-diff | gc.

One ``cmd_<name>`` per subcommand; ``build_parser`` registers them in that order, those of
``cli_diagnose`` (dump, analyze, attach), ``cli_records`` and ``cli_timeline`` through their
``add_parser(s)``; argument types in ``cli_args``, output helpers in ``cli_out``.

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
from typing import List, Optional

from . import __version__
from .cli_args import non_negative, positive_float
from .cli_diagnose import add_parsers as add_diagnose_parsers
from .cli_out import EXIT_PIPE, stdout_closed
from .cli_out import dumps as _dumps
from .cli_out import err as _err
from .cli_records import add_parser as add_records_parser
from .cli_timeline import add_parser as add_timeline_parser
from .tracer import config
from .tracer.errors import HangtraceError, RunDirError


# --- run ------------------------------------------------------------------------------------
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


# --- env-diff (issue 12) -------------------------------------------------------------------
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
EXPORT_WARNING = (
    "# every later Python command of this shell now joins the run (traced into %s); `unset HANGTRACE` to stop"
)


def cmd_env(args: argparse.Namespace) -> int:
    """Print the environment that turns tracing on: by default one ``env K=V ...`` prefix for
    ONE command (``$(hangtrace env) torchrun ...``); ``--export``: shell lines, after a comment
    that every later Python command of the shell then joins the run; ``--ray``: a Ray
    runtime_env JSON fragment."""
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
    elif args.export:
        print(EXPORT_WARNING % run_dir)
        for k, v in env.items():
            print("export %s=%s" % (k, shlex.quote(v)))
    else:
        words = ["%s=%s" % (k, v) for k, v in env.items()]
        if any(shlex.quote(w) != w for w in words):
            print(
                "hangtrace: a value holds a space or a shell character, which `$(hangtrace env)` "
                "splits: use a --dir without them, or --export in a subshell",
                file=sys.stderr,
            )
        print("env " + " ".join(words))
        if sys.stdout.isatty():
            print("usage: $(hangtrace env) torchrun ... (prefixes one command)", file=sys.stderr)
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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hangtrace", description="Which rank broke, where, and why.")
    p.add_argument("--version", action="version", version="hangtrace %s" % __version__)
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="run a command traced; verdict on stall or crash")
    r.add_argument(
        "--stall-s",
        type=positive_float,
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

    add_diagnose_parsers(sub)

    add_records_parser(sub)

    add_timeline_parser(sub)

    e = sub.add_parser(
        "env",
        help="print the environment that turns tracing on, as a prefix of one command: "
        "$(hangtrace env) torchrun ...",
        description="Prints `env HANGTRACE=1 HANGTRACE_DIR=... HANGTRACE_RUN_ID=...`, a prefix "
        "that traces ONE command: $(hangtrace env) torchrun --nproc-per-node 2 train.py",
    )
    e.add_argument("--ray", action="store_true", help="as a Ray runtime_env JSON fragment")
    e.add_argument(
        "--export",
        action="store_true",
        help="as `export` lines for eval: every later Python command of that shell then joins the run",
    )
    e.add_argument("--dir", default=None)
    e.add_argument("--stall-s", type=positive_float, default=None)
    e.set_defaults(fn=cmd_env)

    ed = sub.add_parser("env-diff", help="libraries, versions and environment that differ across ranks")
    ed.add_argument("run_dir", metavar="RUN_DIR")
    ed.add_argument("--json", action="store_true")
    ed.set_defaults(fn=cmd_env_diff)

    g = sub.add_parser("gc", help="delete old run directories (keeps live runs and directories you named)")
    g.add_argument(
        "--keep",
        type=non_negative(int),
        default=None,
        help="newest runs kept (HANGTRACE_GC_KEEP, default 20)",
    )
    g.add_argument(
        "--max-mb",
        type=non_negative(float),
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
