"""Start one node watcher per run and node, from the first traced process (torchrun, Ray).

``hangtrace run`` starts its own watcher and sets ``HANGTRACE_AUTO_WATCH=0`` for the
job. Elsewhere the first traced process on a node that finds no watcher creates
``RUN_DIR/watcher-<host>.pid`` (O_EXCL: exactly one wins) and starts
``python -m hangtrace.tracer.watcher RUN_DIR`` detached, with tracing stripped from its
environment. A pid file whose process is gone is replaced.
"""
import os
import socket
import subprocess
import sys

from ..tracer import config


def _alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def maybe_start(rt):
    """Start the node watcher for ``rt.run_dir`` unless one runs or auto-watch is off.

    Returns the watcher's pid, or None.
    """
    if os.environ.get(config.AUTO_WATCH, config.DEFAULTS[config.AUTO_WATCH]) == "0":
        return None
    pidfile = os.path.join(rt.run_dir, "watcher-%s.pid" % socket.gethostname())
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
        # Through a short-lived intermediate process, so the watcher is not our child:
        # a program that calls os.wait() must never reap it by surprise.
        launcher = ("import subprocess, sys; p = subprocess.Popen(sys.argv[1:], start_new_session=True, "
                    "stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
                    "print(p.pid)")
        out = subprocess.run([sys.executable, "-c", launcher, sys.executable, "-m", "hangtrace.tracer.watcher",
                              rt.run_dir], env=config.helper_env(), stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=30, check=True)
        pid = int(out.stdout.strip())
        os.write(fd, str(pid).encode())
        rt.log("started node watcher pid %d" % pid)
        return pid
    except BaseException:
        try:
            os.unlink(pidfile)  # let a later process try again
        except OSError:
            pass
        raise
    finally:
        os.close(fd)
