"""``hangtrace run``'s supervision: start the job traced, watch it, report, exit like it.

The job runs in its own session with tracing turned on; an embedded :class:`Watcher`
polls its rings. On a stall or a death the pipeline (``tracer.pipeline.dump_live``)
snapshots and diagnoses the run and the verdict goes to stderr: one per incident, a later
part of it (``Incident.follows``) printed only when its verdict differs, as replacing the
one before (``watch/verdictbook.py``). The first SIGINT/SIGTERM
from the user is passed on to the job's process group, a second one SIGKILLs it; deaths
while the user stops the job are no incident. ``--stop-on-stall`` stops the job after a
stall verdict (SIGTERM, then SIGKILL after 5 s).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

from hangtrace.tracer import config
from hangtrace.tracer.errors import HangtraceError
from hangtrace.tracer.collect import pidwatch
from hangtrace.tracer.ring import layout as F

Log = Callable[[str], None]


def _err(msg: str) -> None:
    sys.stderr.write("hangtrace: %s\n" % msg)
    sys.stderr.flush()


@dataclass(frozen=True)
class RunOptions:
    """What ``hangtrace run`` was asked: ``stall_s`` and ``poll_s`` in seconds (None =
    configuration default), ``run_dir`` (None = a new temp dir)."""

    cmd: List[str]
    run_dir: Optional[str] = None
    stall_s: Optional[float] = None
    poll_s: Optional[float] = None
    native: bool = False
    stop_on_stall: bool = False
    #: False: no timeline.json at an incident (HANGTRACE_TIMELINE=0, issue 11)
    timeline: bool = True
    #: deep-trace selection for the job, e.g. 'rank=1,phase=train' (HANGTRACE_DEEP, issue 11)
    deep: Optional[str] = None


def exit_status(rc: int) -> int:
    """A child's return code as shells report it (128+N when killed by signal N)."""
    return 128 - rc if rc < 0 else rc


def prepare_run_dir(path: str) -> bool:
    """Create the run directory; True when it was created here. HangtraceError (exit 2)
    with a remedy when it cannot be used."""
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


def _start(
    cmd: List[str],
    run_dir: str,
    run_id: str,
    stall_s: Optional[float],
    created: bool,
    extra_env: Optional[Dict[str, str]] = None,
) -> "subprocess.Popen[bytes]":
    env = dict(os.environ)
    env.pop(config.HELPER, None)
    env.update({config.ENABLE: "1", config.DIR: run_dir, config.RUN_ID: run_id, config.AUTO_WATCH: "0"})
    if stall_s is not None:
        env[config.STALL_S] = str(stall_s)
    env.update(extra_env or {})
    try:
        return subprocess.Popen(cmd, env=env, start_new_session=True)
    except OSError as e:
        if created:
            try:
                os.rmdir(run_dir)  # leave no empty run directory behind
            except OSError:
                pass
        err = HangtraceError(
            "cannot start %r: %s" % (cmd[0], e.strerror or e),
            "check the command name, its permissions and PATH",
        )
        # shell convention: 127 command not found, 126 found but not executable
        err.exit_code = 127 if isinstance(e, FileNotFoundError) else 126
        raise err from None


def supervise(opts: RunOptions, log: Log = _err) -> int:
    """Run ``opts.cmd`` traced until it ends; returns its exit status (shell convention).

    Raises HangtraceError when no command is given, the run directory is unusable or the
    command cannot be started (exit 127/126).
    """
    from hangtrace.hooks.state import default_run_id
    from hangtrace.tracer.pipeline import dump_live
    from hangtrace.tracer.watch.detector import Watcher
    from hangtrace.tracer.watch.housekeeping import tidy_gone
    from hangtrace.tracer.watch.verdictbook import NEW, SAME, VerdictBook, drop_repeat

    cmd = opts.cmd[1:] if opts.cmd and opts.cmd[0] == "--" else opts.cmd
    if not cmd:
        raise HangtraceError("no command given", "usage: hangtrace run [options] -- CMD ...")
    run_id = default_run_id()
    run_dir = (
        os.path.abspath(opts.run_dir)
        if opts.run_dir
        else os.path.join(__import__("tempfile").gettempdir(), "hangtrace-" + run_id)
    )
    created = prepare_run_dir(run_dir)
    extra: Dict[str, str] = {}
    if not opts.timeline:  # issue 11: here too, the incident's timeline is written by this process
        extra[config.TIMELINE] = os.environ[config.TIMELINE] = "0"
    if opts.deep:
        extra[config.DEEP] = opts.deep
    child = _start(cmd, run_dir, run_id, opts.stall_s, created, extra)
    log("run directory %s" % run_dir)
    pidfile = _write_run_pidfile(run_dir)  # issue 13: `hangtrace gc` keeps this run while we run
    if not opts.run_dir:  # issue 13: old runs in the default location, per the retention policy
        from hangtrace.tracer.watch.housekeeping import auto_prune

        auto_prune(log)
    interrupts: List[int] = []  # signals received from the user (Ctrl-C, kill)

    def forward(signum: int, frame: Any) -> None:
        # first SIGINT/SIGTERM: passed on to the job; a second one: SIGKILL the job's group
        interrupts.append(signum)
        try:
            os.killpg(child.pid, signum if len(interrupts) == 1 else signal.SIGKILL)
        except OSError:
            pass
        if len(interrupts) == 2:
            log("second interrupt: killing the job (SIGKILL)")

    old: Dict[int, Any] = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    pidwatch.enable(F.proc_start_ticks)  # liveness from pidfds in this process (issue 40)
    w = Watcher(run_dir, stall_s=opts.stall_s, clock=time.monotonic)
    # issue 41: the watcher's notes on the job's life (a pooled Ray worker retired, a clean
    # shutdown held, deaths after the stall) go to the watcher log, not the console; why no
    # stall is called yet (processes busy on CPU) stays on the console
    w.say = log
    w.straggler_echo = log  # issue 43: the straggler lines go to the watcher log file and here
    from hangtrace.tracer.watch.jobwatch import JobWatch, answer_all, local_incident

    # issue 39: the other nodes of the job; the meeting's notes (registered, incidents of other
    # nodes, the store gone) go to the watcher log: the console shows the verdict
    jw = JobWatch(run_dir, w.note, w.stall_s).start()

    def dump(kind: str) -> Any:
        return dump_live(run_dir, kind, native=opts.native, stall_s=w.stall_s)

    book = VerdictBook()

    def shown(res: Any, follows: bool = False) -> None:
        # issue 38: one verdict per incident; a later, different one replaces it
        if res is None:
            return
        how = book.judge(res, follows)
        if how == SAME:
            drop_repeat(res)
            w.note("verdict unchanged (the same incident): %s" % book.snapshot)
            return
        title = "hangtrace verdict" + ("" if how == NEW else ", replacing the one above (the same incident)")
        report(res.snapshot.path or run_dir, res.snapshot.run_dir, res.paragraph, title)

    poll = (
        opts.poll_s
        if opts.poll_s is not None
        else min(config.get_float(config.POLL_S), max(0.2, w.stall_s / 4))
    )
    reported = stopped = False
    try:
        while True:
            try:
                rc = child.wait(timeout=poll)
                w.stragglers.close("the job ended")
                break
            except subprocess.TimeoutExpired:
                pass
            if interrupts:
                continue  # the user is stopping the job: its deaths are no incident
            answer_all(jw, dump, shown)
            inc = w.poll()
            if inc is None:
                continue
            for line in inc.lines:
                w.note("%s: %s%s" % (inc.kind, line, " (the same incident)" if inc.follows else ""))
            _say_incident(inc)
            reported = True  # one verdict per incident, even when the diagnosis failed
            try:
                shown(local_incident(jw, inc.kind, inc.detail, dump), inc.follows)
            except HangtraceError as e:
                sys.stderr.write(e.render() + "\n")
            if opts.stop_on_stall and inc.kind == "stall":
                # a death is not a stall: let the job end by itself (and exit with its own
                # status); if the survivors hang, the stall that follows stops it
                log("stopping the job (--stop-on-stall)")
                jw.await_takers()  # (node 0: its job hosts the store the other nodes read)
                stop(child)
                stopped = True
        _last_part(
            w,
            lambda inc: shown(local_incident(jw, inc.kind, inc.detail, dump), True),
            reported,
            stopped,
            interrupts,
        )
        if stopped:
            # (blind helpers 53, 56, 57, 60: a script could not tell this status from a crash)
            log(
                "the job was stopped after the verdict above (--stop-on-stall): its exit status %d is its answer "
                "to that stop (SIGTERM: torchrun exits 1, a Ray driver 134, most processes 143), not a failure "
                "of its own" % exit_status(rc)
            )
        elif interrupts:
            log("command interrupted; exit status %d; records in %s" % (exit_status(rc), run_dir))
        elif rc != 0 and not reported:
            # a crash the watcher did not catch in time (or a fast failure): analyse what is left
            try:
                w.poll()
                shown(
                    local_incident(
                        jw,
                        "death",
                        "the job exited with status %d" % exit_status(rc),
                        lambda kind: dump_live(run_dir, kind, with_stacks=False, stall_s=w.stall_s),
                    )
                )
            except HangtraceError as e:
                sys.stderr.write(e.render() + "\n")
        elif rc == 0:
            log("command finished with status 0; records in %s" % run_dir)
            _clean_exit_check(run_dir)
    finally:
        jw.stop()
        for s, h in old.items():
            signal.signal(s, h)
        if child.poll() is None:
            stop(child)
        tidy_gone(run_dir, wait_s=2.0)  # the empty stack files of the processes gone (within 2 s)
        if pidfile:
            try:
                os.unlink(pidfile)
            except OSError:
                pass
    return exit_status(rc)


def _say_incident(inc: Any) -> None:
    """The console line of a new incident (a later part of one: its verdict only if it
    differs, ``watch/verdictbook.py``)."""
    from hangtrace.tracer.report.console import console_width, incident_line

    if not inc.follows:
        sys.stderr.write(incident_line(inc.kind, inc.lines, console_width(sys.stderr)) + "\n")
        sys.stderr.flush()


def _last_part(
    w: Any, give: Callable[[Any], None], reported: bool, stopped: bool, interrupts: List[int]
) -> None:
    """After the job ended by itself (``reported``: an incident was; not ``stopped`` by
    ``--stop-on-stall``, nor by the user's ``interrupts``): one more poll of ``w`` (the detector); a part of the incident
    reported before that the job's end left unpolled (the last ranks SIGTERMed by the
    launcher as it exits) is diagnosed and given to ``give`` (issue 38: the snapshot taken at
    the first death may predate them; its verdict is replaced if the later one differs)."""
    if not reported or stopped or interrupts:
        return
    try:
        inc = w.poll()
        if inc is not None and inc.follows:
            for line in inc.lines:
                w.note("%s: %s (the same incident)" % (inc.kind, line))
            give(inc)
    except HangtraceError as e:
        sys.stderr.write(e.render() + "\n")


#: what a run that exited 0 is still reported for: (``details`` key, snapshot reason)
CLEAN_EXIT_FINDINGS = (
    ("silent", "silent-mismatch"),  # rule silent_mismatch: gloo completed a collective the ranks disagreed on
    (
        "minority_failed",
        "caught-failure",
    ),  # rule minority: a rank alone in a collective that failed, error caught
    (
        "group_order",
        "group-order",
    ),  # analyze/graph/groupdefs.py: groups created in another order (their sums were wrong)
)


def _clean_exit_check(run_dir: str) -> None:
    """A job that exited 0 may still have gone wrong: it ran on with wrong data (gloo
    completes some collectives whose sizes or dtypes disagree, rule ``silent_mismatch``; ranks
    that created their groups in another order summed with the wrong peers, ``groupdefs``), or
    a rank entered a collective alone after the others had left and the program caught its
    failure (blind helper 87: an ``atexit`` all_reduce on one rank; the metrics it gathered
    were never written). Analysed once, without stacks; a verdict block and a snapshot only
    when that is what it finds (``CLEAN_EXIT_FINDINGS``)."""
    from hangtrace.tracer.collect.rings import load_run_or_fr
    from hangtrace.tracer.pipeline import diagnose_snapshot, dump_live, readable

    try:  # the rings as they are now (an earlier snapshot of this run is not what ended)
        snap = readable(load_run_or_fr(run_dir), lambda _line: None)
        details = diagnose_snapshot(snap).diagnosis.details or {}
        reason = next((why for key, why in CLEAN_EXIT_FINDINGS if details.get(key)), None)
        if reason is None:
            return
        res = dump_live(run_dir, reason, with_stacks=False)
        report(res.snapshot.path or run_dir, res.snapshot.run_dir, res.paragraph)
    except HangtraceError as e:
        sys.stderr.write(e.render() + "\n")


def _write_run_pidfile(run_dir: str) -> Optional[str]:
    """Write ``RUN_DIR/run-<host>.pid`` (this process's pid) so that `hangtrace gc` sees the
    run as alive even before the job's first traced process writes its ring; its path or None."""
    path = os.path.join(run_dir, "run-%s.pid" % os.uname().nodename)
    try:
        with open(path, "w") as f:
            f.write(str(os.getpid()))
        return path
    except OSError:
        return None


def report(snap_path: str, run_dir: str, paragraph: str, title: str = "hangtrace verdict") -> None:
    """The verdict block ``hangtrace run`` writes to stderr, wrapped to its width
    (``report/console.py``); ``title``: its heading."""
    from hangtrace.tracer.report.console import console_width, verdict_block

    tl = os.path.join(snap_path, "timeline.json")
    sys.stderr.write(
        verdict_block(
            paragraph,
            snap_path,
            run_dir,
            console_width(sys.stderr),
            tl if os.path.exists(tl) else None,  # issue 11
            title=title,
        )
    )
    sys.stderr.flush()


def stop(child: "subprocess.Popen[bytes]", grace_s: float = 5.0) -> None:
    """SIGTERM the job's process group, SIGKILL it after ``grace_s`` seconds."""
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
