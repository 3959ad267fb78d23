"""Activation inside a traced process: called by the ``.pth`` line when HANGTRACE is set.

``activate()`` creates this process's ring in the run directory, installs lifecycle
records (exit, uncaught exceptions, SIGTERM and fatal-signal stacks through
faulthandler), and registers post-import hooks so torch.distributed (and Ray, later)
are wrapped when the program imports them (Ray: ``ray_hooks``). It imports neither torch nor ray.

Any failure here disables tracing for this process with one line on stderr and, where
possible, a line in the run log; the program itself runs on unchanged.
"""
import os
import sys
import tempfile
import threading
import time

from hangtrace.tracer import api
from hangtrace.tracer import config

_active = None  # the Runtime of this process, or None
_lock = threading.Lock()
_failed_pid = None  # pid in which activation failed (and warned) already


class RunLog:
    """Appends lines to ``RUN_DIR/hangtrace.log``; ``__call__(msg, key)`` logs once per key."""

    def __init__(self, run_dir):
        self.path = os.path.join(run_dir, "hangtrace.log")
        self.seen = set()

    def __call__(self, msg, key=None):
        if key is not None:
            if key in self.seen:
                return
            self.seen.add(key)
        try:
            line = "%s pid=%d %s\n" % (time.strftime("%Y-%m-%dT%H:%M:%S"), os.getpid(), msg)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, line.encode("utf-8", "replace"))
            finally:
                os.close(fd)
        except Exception:
            pass


def default_run_id():
    return "%s-%d" % (time.strftime("%Y%m%d-%H%M%S", time.gmtime()), os.getpid())


def resolve_run_dir(environ=None):
    """The run directory for this process; exports HANGTRACE_DIR/RUN_ID for children.

    Returns ``(run_dir, run_id)``. Creates the directory (mode 0700) if needed.
    Raises OSError when it cannot be created.
    """
    env = os.environ if environ is None else environ
    run_id = env.get(config.RUN_ID) or default_run_id()
    run_dir = env.get(config.DIR) or os.path.join(tempfile.gettempdir(), "hangtrace-" + run_id)
    # absolute, so children started in another working directory (Ray workers, tools
    # that chdir) find the same directory
    run_dir = os.path.abspath(run_dir)
    os.makedirs(run_dir, mode=0o700, exist_ok=True)
    env[config.DIR] = run_dir
    env[config.RUN_ID] = run_id
    return run_dir, run_id


class Runtime:
    def __init__(self, run_dir, run_id):
        from .recorder import Recorder
        self.run_dir = run_dir
        self.run_id = run_id
        self.log = RunLog(run_dir)
        self.recorder = Recorder(run_dir, run_id, config.get_int(config.SLOTS), self.log)
        self.torch_hooked = False


def _hook_torch(module):
    rt = _active
    if rt is None:
        return
    try:
        dist = sys.modules.get("torch.distributed", module)
        if not getattr(dist, "is_available", lambda: False)():
            return
        from . import torch_dist
        torch_dist.install(dist, rt.recorder, rt.log)
        rt.torch_hooked = True
        _record_env(rt, "torch")  # issue 12
    except Exception as e:
        rt.log("hooking torch.distributed failed: %r" % (e,), "hook-torch")


# --- ray (issue 4): actor identity and method phases, see hooks/ray_hooks.py ---
def _hook_ray(module):
    rt = _active
    if rt is None:
        return
    try:
        from . import ray_hooks
        ray_hooks.install(sys.modules.get("ray", module), rt.recorder, rt.log)
    except Exception as e:
        rt.log("hooking ray failed: %r" % (e,), "hook-ray")
# --- end ray ---


# --- environment forensics (issue 12): RUN_DIR/env/<host>-<pid>.json, see hooks/envrecord.py ---
def _record_env(rt: "Runtime", reason: str, ctypes_hook: bool = False) -> None:
    try:
        from . import envrecord
        envrecord.record(rt, reason)
        if ctypes_hook:
            envrecord.install_ctypes_hook(rt)
    except Exception as e:
        rt.log("environment record failed: %r" % (e,), "env-record")
# --- end environment forensics ---


# --- memory (issue 5): sampler thread 'hangtrace-memory', see hooks/memory.py ---
def _start_memory(rt, forked=False):
    try:
        from . import memory
        memory.start(rt, forked=forked)
    except Exception as e:
        rt.log("memory sampling failed to start: %r" % (e,), "mem-start")
# --- end memory ---


def _register_import_hooks():
    import wrapt
    if "torch.distributed" in sys.modules:
        _hook_torch(sys.modules["torch.distributed"])
    else:
        wrapt.register_post_import_hook(_hook_torch, "torch.distributed")
    from . import failures  # issue 9: failures caught at their source
    for name, hook in failures.IMPORT_HOOKS.items():
        if name in sys.modules:
            hook(sys.modules[name])
        else:
            wrapt.register_post_import_hook(hook, name)
    if "ray" in sys.modules:  # issue 4
        _hook_ray(sys.modules["ray"])
    else:
        wrapt.register_post_import_hook(_hook_ray, "ray")


def _after_fork_child():
    global _active
    old = _active
    if old is None:
        return
    try:
        old.recorder.abandon()
        phase, step = old.recorder.current()
        rt = Runtime(old.run_dir, old.run_id)
        _active = rt
        api._set_recorder(rt.recorder)
        from . import lifecycle
        lifecycle.install(rt, forked_from=old.recorder.pid)
        if step is not None:
            rt.recorder.step(step)
        if "torch.distributed" in sys.modules:
            from . import torch_dist
            torch_dist.reset_after_fork(rt.recorder)
        _start_memory(rt, forked=True)  # issue 5: the parent's sampler thread is not here
        _record_env(rt, "fork")  # issue 12
    except Exception as e:
        _active = None
        api._set_recorder(None)
        # the parent's ring is still mapped here: no hook may write into it any more
        try:
            td = sys.modules.get("hangtrace.hooks.torch_dist")
            if td is not None:
                td._state = None
            from . import lifecycle
            lifecycle.detach()
        except Exception:
            pass
        _warn("tracing disabled in forked child %d: %r" % (os.getpid(), e))


def _warn(msg):
    try:
        sys.stderr.write("hangtrace: %s\n" % msg)
    except Exception:
        pass


def activate():
    """Turn tracing on in this process (idempotent). Returns the Runtime or None."""
    global _active, _failed_pid
    with _lock:
        if _active is not None:
            return _active
        if not config.enabled() or _failed_pid == os.getpid():
            return None  # (a .pth can be processed twice, e.g. in some venvs: warn once)
        try:
            run_dir, run_id = resolve_run_dir()
            rt = Runtime(run_dir, run_id)
        except Exception as e:
            _failed_pid = os.getpid()
            _warn("tracing disabled for pid %d: cannot create the flight record in %r: %s "
                  "(remedy: set HANGTRACE_DIR to a writable directory with free space)"
                  % (os.getpid(), os.environ.get(config.DIR), e))
            return None
        _active = rt
        api._set_recorder(rt.recorder)
        try:
            from . import lifecycle
            lifecycle.install(rt)
        except Exception as e:
            rt.log("lifecycle hooks failed: %r" % (e,), "lifecycle")
        try:
            from . import failures
            failures.configure(lambda: api._recorder, rt.log)
        except Exception as e:
            rt.log("failure capture failed: %r" % (e,), "failures")
        try:
            _register_import_hooks()
        except Exception as e:
            rt.log("import hooks failed: %r" % (e,), "import-hooks")
        _start_memory(rt)  # issue 5
        _record_env(rt, "bootstrap", ctypes_hook=True)  # issue 12
        try:
            os.register_at_fork(after_in_child=_after_fork_child)
        except Exception as e:
            rt.log("fork hook failed: %r" % (e,), "fork")
        try:
            from . import autowatch
            autowatch.maybe_start(rt)
        except ImportError:
            pass
        except Exception as e:
            rt.log("starting the node watcher failed: %r" % (e,), "autowatch")
        return rt


def active():
    return _active
