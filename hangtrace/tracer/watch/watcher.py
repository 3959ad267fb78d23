"""The node watcher as a process: ``python -m hangtrace.tracer.watch.watcher RUN_DIR`` (what a
traced process starts when no watcher runs on its node). RUN_DIR in; its ``detector.Watcher``
polled until nothing is left to watch, each incident handed to ``tracer.pipeline.dump_live``
and logged (verdict, snapshot) in RUN_DIR/watcher-<host>.log, and written to the launching
terminal (``watch/terminal.py``); one verdict per incident (``watch/verdictbook.py``); exit
status out. ``hangtrace
run`` embeds the same ``Watcher`` instead (``watch/supervise.py``).
"""

from __future__ import annotations

import os
import sys
import time

from hangtrace.tracer import config
from hangtrace.tracer.collect import pidwatch
from hangtrace.tracer.ring import layout as F
from hangtrace.tracer.watch.detector import Watcher
from hangtrace.tracer.watch.terminal import launching_tty, tell_terminal
from hangtrace.tracer.watch.verdictbook import NEW, SAME, VerdictBook, drop_repeat


def run_dir_gone(run_dir: str, ino: "tuple[int, int]") -> "str | None":
    """Why a standalone watcher of ``run_dir`` has nothing left to watch, or None: the
    directory was deleted (``rm -r``, ``hangtrace gc``) or replaced by another one of the
    same name (``ino``: its (device, inode) when the watcher started)."""
    try:
        st = os.stat(run_dir)
    except FileNotFoundError:
        return "run directory %s was deleted" % run_dir
    except OSError as e:
        return "run directory %s cannot be read: %s" % (run_dir, e.strerror or e)
    if (st.st_dev, st.st_ino) != ino:
        return "run directory %s was replaced by another directory" % run_dir
    return None


def main(argv: "list[str] | None" = None) -> int:
    """Standalone node watcher: ``python -m hangtrace.tracer.watch.watcher RUN_DIR``.

    Logs to RUN_DIR/watcher-<host>.log. Exits (status 0) when no traced process of the run
    is alive on this node any more (after a grace period of 2 polls), when no ring file has
    been in the run directory for ``HANGTRACE_STARTUP_STALL_S`` seconds (they were
    deleted), and at the next poll when the run directory was deleted or replaced: an
    auto-started watcher must not outlive its run. Exits with 4 when RUN_DIR does not exist.
    """
    import socket
    from hangtrace.tracer.pipeline import dump_live
    from hangtrace.tracer.watch.jobwatch import JobWatch, answer_all, local_incident

    argv = sys.argv[1:] if argv is None else argv
    run_dir = argv[0]
    poll = config.get_float(config.POLL_S)
    log_path = os.path.join(run_dir, "watcher-%s.log" % socket.gethostname())
    pidwatch.enable(F.proc_start_ticks)  # liveness from pidfds in this process (issue 40)
    w = Watcher(run_dir)
    idle = 0
    w.mem_log = lambda line: log(line)  # issue 5: memory early warnings
    w.log = lambda line: log(line)

    def log(msg: str) -> None:
        try:
            with open(log_path, "a") as f:
                f.write("%s %s\n" % (time.strftime("%Y-%m-%dT%H:%M:%S"), msg))
        except OSError:
            pass  # the run directory went away: the next poll ends the watcher

    try:
        st = os.stat(run_dir)
    except OSError as e:
        sys.stderr.write(
            "hangtrace watcher: cannot watch %s: %s (remedy: pass the run directory of a "
            "traced job, HANGTRACE_DIR)\n" % (run_dir, e.strerror or e)
        )
        return 4
    ino = (st.st_dev, st.st_ino)
    log("watcher started, pid %d, stall threshold %.1f s" % (os.getpid(), w.stall_s))
    jw = JobWatch(run_dir, log, w.stall_s).start()  # issue 39: the other nodes of the job

    def dump(kind: str) -> "object":
        return dump_live(run_dir, kind, log=log, stall_s=w.stall_s)

    book, tty = VerdictBook(), launching_tty()

    def report(res: "object", follows: bool = False) -> None:
        # issue 38: one verdict per incident; a later, different one replaces it
        if res is None:
            return
        how = book.judge(res, follows)
        if how == SAME:
            drop_repeat(res)
            log("verdict unchanged (the same incident): %s" % book.snapshot)
            return
        head = "verdict" if how == NEW else "verdict (replaces the one above: the same incident)"
        log("%s: %s" % (head, res.paragraph))  # type: ignore[attr-defined]
        log("snapshot: %s" % res.snapshot.path)  # type: ignore[attr-defined]
        tell_terminal(
            tty, res, "hangtrace verdict (node watcher)" + ("" if how == NEW else ", replacing the one above")
        )

    last_ring = time.monotonic()
    while True:
        if run_dir_gone(run_dir, ino):
            return 0  # no log line: the log was deleted, or is another run's now
        inc = w.poll()
        if inc is not None:
            log("%s: %s%s" % (inc.kind, inc.detail, " (the same incident)" if inc.follows else ""))
            try:
                report(local_incident(jw, inc.kind, inc.detail, dump), inc.follows)
            except Exception as e:
                log("diagnosis failed: %r" % (e,))
        answer_all(jw, dump, report)
        if w.headers:
            last_ring = time.monotonic()
        elif time.monotonic() - last_ring >= max(w.startup_stall_s, 2 * poll):
            log("no ring file in %s for %.0f s; watcher exits" % (run_dir, time.monotonic() - last_ring))
            return 0
        if w.any_alive() or not w.headers:
            idle = 0
        else:
            idle += 1
            if idle >= 2:
                w.stragglers.close("no traced process alive on this node")
                log("no traced process alive on this node; watcher exits")
                return 0
        time.sleep(poll)


if __name__ == "__main__":
    sys.exit(main())
