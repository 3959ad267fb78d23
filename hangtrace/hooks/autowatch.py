"""Start one node watcher per run and node, from the first traced process (torchrun, Ray).

``hangtrace run`` starts its own watcher and sets ``HANGTRACE_AUTO_WATCH=0`` for the
job. Elsewhere the first traced process on a node that finds no watcher creates
``RUN_DIR/watcher-<host>.pid`` (O_EXCL: exactly one wins) and starts
``python -m hangtrace.tracer.watch.watcher RUN_DIR`` detached, with tracing stripped from its
environment. A pid file whose process is gone is replaced.

The pid file is per host, not per Ray node: several Ray nodes on one host (as with
``ray.cluster_utils.Cluster``) share the host name and the run directory, so one watcher
reads every ring of the host. When the starting process is a Ray worker, the watcher gets
``RAY_ADDRESS`` = the GCS address of the worker's own cluster (its ``--gcs-address``
argument, set by the raylet that started it), so its cluster-wide collection reaches the
right cluster even when several run on the host (``auto`` may pick another one), and Ray's
internal per-worker flags (``RAY_JOB_ID``, ``RAY_RAYLET_PID``; ``ray_constants.
RAY_INTERNAL_FLAGS``) are dropped from its environment. Where the starting process's stderr
is a terminal (a user's shell running ``HANGTRACE=1 torchrun ...``), the watcher is told its
device and writes each verdict there as well as to its log (issue 38).
"""

from __future__ import annotations

import os
import sys
from typing import Any, List, Optional

from hangtrace.tracer import config


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


#: Ray's internal per-worker flags (``ray._private.ray_constants.RAY_INTERNAL_FLAGS``):
#: never for a process that may connect to Ray as a driver.
_RAY_WORKER_ONLY = ("RAY_JOB_ID", "RAY_RAYLET_PID", "RAY_OVERRIDE_NODE_ID_FOR_TESTING")


def ray_gcs_address(argv: Optional[List[str]] = None) -> Optional[str]:
    """The ``--gcs-address`` of this process when it is a Ray worker, else None.

    Ray's raylet starts every worker (``default_worker.py``) with ``--gcs-address=HOST:PORT``
    on its command line; read from ``/proc/self/cmdline`` (``sys.argv`` may not be set
    yet when the ``.pth`` line runs).
    """
    if argv is None:
        try:
            with open("/proc/self/cmdline", "rb") as f:
                argv = f.read().decode("utf-8", "replace").split("\0")
        except OSError:
            argv = list(sys.argv)
    for i, a in enumerate(argv):
        if a.startswith("--gcs-address="):
            return a.split("=", 1)[1] or None
        if a == "--gcs-address" and i + 1 < len(argv):
            return argv[i + 1] or None
    return None


def stderr_tty() -> Optional[str]:
    """The terminal device of this process's stderr (``/dev/pts/N``), or None when stderr is
    not a terminal (a file, a pipe, Ray's worker log). Never raises."""
    try:
        return os.ttyname(2) if os.isatty(2) else None
    except OSError:
        return None


def watcher_env() -> dict:
    """Environment of the detached watcher: tracing stripped (``config.helper_env``), Ray's
    per-worker flags dropped, ``RAY_ADDRESS`` set to this Ray worker's cluster,
    ``HANGTRACE_WATCH_TTY`` set to this process's terminal where its stderr is one (the
    watcher writes its verdicts there too, issue 38)."""
    env = config.helper_env()
    env.pop(config.WATCH_TTY, None)
    tty = stderr_tty()
    if tty:
        env[config.WATCH_TTY] = tty
    gcs = ray_gcs_address()
    if gcs:
        for k in _RAY_WORKER_ONLY:
            env.pop(k, None)
        env["RAY_ADDRESS"] = gcs
    return env


def maybe_start(rt: Any) -> Optional[int]:
    """Start the node watcher for ``rt.run_dir`` unless one runs or auto-watch is off.

    Returns the watcher's pid, or None.
    """
    if os.environ.get(config.AUTO_WATCH, config.DEFAULTS[config.AUTO_WATCH]) == "0":
        return None
    # host name as socket.gethostname() gives it on Linux, without importing socket
    pidfile = os.path.join(rt.run_dir, "watcher-%s.pid" % os.uname().nodename)
    for _ in range(2):
        try:
            fd = os.open(pidfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            break
        except FileExistsError:
            try:
                with open(pidfile) as f:
                    pid = int(f.read().strip() or 0)
            except (OSError, ValueError):
                return None  # being written by the winner right now
            if not pid or _alive(pid):
                return None  # empty: the winner is starting the watcher right now
            try:
                os.unlink(pidfile)
            except OSError:
                return None
    else:
        return None
    try:
        import subprocess  # only in the one process per node that starts the watcher

        env = watcher_env()
        # Through a short-lived intermediate process, so the watcher is not our child:
        # a program that calls os.wait() must never reap it by surprise.
        launcher = (
            "import subprocess, sys; p = subprocess.Popen(sys.argv[1:], start_new_session=True, "
            "stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
            "print(p.pid)"
        )
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                launcher,
                sys.executable,
                "-m",
                "hangtrace.tracer.watch.watcher",
                rt.run_dir,
            ],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            timeout=30,
            check=True,
        )
        pid = int(out.stdout.strip())
        os.write(fd, str(pid).encode())
        rt.log(
            "started node watcher pid %d%s"
            % (pid, " (RAY_ADDRESS %s)" % env["RAY_ADDRESS"] if env.get("RAY_ADDRESS") else "")
        )
        return pid
    except BaseException:
        try:
            os.unlink(pidfile)  # let a later process try again
        except OSError:
            pass
        raise
    finally:
        os.close(fd)
