"""Activation inside a traced process: called by the ``.pth`` line when HANGTRACE is set.

``activate()`` creates this process's ring in the run directory (small until the process
joins a process group or becomes a Ray actor: ``hooks/record/ringsize.py``), then installs the
instrumentors in this order (``INSTRUMENTORS``):

1. lifecycle: start record, exit code, uncaught exceptions, signal stacks (faulthandler);
2. failures: exceptions that launchers and frameworks swallow (spawn, multiprocessing,
   unretrieved asyncio tasks), ``hooks/process/failures.py``;
3. memory: the sampler (``HANGTRACE_MEM=0``: none);
4. torch: a post-import hook; torch.distributed is wrapped when the program imports it;
5. ray: a post-import hook; Ray worker identity and actor-method phases;
6. env-record: libraries, versions and job environment, written once the process matters
   (issue 12, ``hooks/env/envrecord.py``);
7. deep: only with ``HANGTRACE_DEEP`` (issue 11, viztracer).

ONE ``os.register_at_fork(before=..., after_in_child=...)`` registration: before a fork,
the parent imports what its child's handler needs (the sampler's ``hooks/mem/memfork.py``), so no child
pays for an import; in the child, it gets its own ring and then every instrumentor's
``after_fork_child`` runs in that order; ONE exit handler
calls every ``at_exit`` in reverse order, so threads stop before lifecycle writes the
exit record. The Python or C recorder is chosen in one place (``recorder.choose``) and
the reason written to the run log. It imports neither torch nor ray nor wrapt.

Any failure here disables tracing for this process with one line on stderr and, where
possible, a line in the run log; the program itself runs on unchanged.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from typing import Any, List, Mapping, Optional, Tuple

from hangtrace.hooks import preload

preload.load("activate")  # the modules activate() imports, from one file (hooks/preload.py)

from hangtrace.hooks import state
from hangtrace.hooks.instrument import Instrumentor
from hangtrace.hooks.state import default_run_id
from hangtrace.tracer import api
from hangtrace.tracer import config

_lock = threading.Lock()
_failed_pid: Optional[int] = None  # pid in which activation failed (and warned) already
INSTRUMENTORS: List[Instrumentor] = []  # in install order (filled by activate)


class RunLog:
    """Appends lines to ``RUN_DIR/hangtrace.log``; ``__call__(msg, key)`` logs once per key."""

    def __init__(self, run_dir: str) -> None:
        self.path = run_dir + "/hangtrace.log"  # (POSIX; no os.path.join: made in every forked child)
        self.seen: set = set()

    def __call__(self, msg: str, key: Optional[str] = None) -> None:
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


def _tempdir(env: Mapping[str, str]) -> str:
    """``tempfile.gettempdir()`` for the usual cases without importing tempfile."""
    for name in ("TMPDIR", "TEMP", "TMP"):
        d = env.get(name)
        if d and os.path.isdir(d):
            return d
    if os.path.isdir("/tmp"):
        return "/tmp"
    import tempfile

    return tempfile.gettempdir()


def resolve_run_dir(environ: Optional[dict] = None) -> Tuple[str, str]:
    """The run directory for this process; exports HANGTRACE_DIR/RUN_ID for children.

    Returns ``(run_dir, run_id)``. Creates the directory (mode 0700) if needed.
    Raises OSError when it cannot be created.
    """
    env = os.environ if environ is None else environ
    run_id = env.get(config.RUN_ID) or default_run_id()
    run_dir = env.get(config.DIR) or os.path.join(_tempdir(env), "hangtrace-" + run_id)
    # absolute, so children started in another working directory (Ray workers, tools
    # that chdir) find the same directory
    run_dir = os.path.abspath(run_dir)
    os.makedirs(run_dir, mode=0o700, exist_ok=True)
    env[config.DIR] = run_dir
    env[config.RUN_ID] = run_id
    return run_dir, run_id


class Runtime:
    """This process's tracing state: run directory, run log, recorder (one per process;
    the same object in a forked child, where ``new_recorder`` gives it its own ring)."""

    def __init__(self, run_dir: str, run_id: str) -> None:
        self.run_dir = run_dir
        self.run_id = run_id
        self.log = RunLog(run_dir)
        self.parent_pid: Optional[int] = None  # set in a forked child: the pid forked from
        self._choice: Optional[Tuple[type, int, int]] = None  # (recorder class, small, full slots)
        self.recorder = self._make_recorder()
        #: (pid that built it, the next forked child's lazy recorder): ``prepare_child``
        self._child_recorder: Optional[Tuple[int, Any]] = None

    def _make_recorder(self, lazy: bool = False) -> Any:
        """A Recorder (Python or C, ``recorder.choose``) with a small ring grown to
        ``HANGTRACE_SLOTS`` by role; the choice and its reason go to the run log.

        The choice and the ring sizes are made once per Runtime: a forked child (same
        environment, same interpreter) reuses its parent's and writes no log line (issue
        13: every line is a file opened and written in every DataLoader worker)."""
        choice, reason = self._choice, None
        if choice is None:
            from hangtrace.hooks.record.recorder import choose

            cls, reason = choose()
            full = config.get_int(config.SLOTS)
            small = config.get_int(config.HELPER_SLOTS)
            if small <= 0 or small >= full:
                small = full
            choice = self._choice = (cls, small, full)
        cls, small, full = choice
        rec = cls(self.run_dir, self.run_id, small, self.log, full_slots=full, lazy=lazy)
        if reason is not None:  # (after the ring: a full disk leaves no log file behind either)
            self.log(reason, "recorder-choice")
        return rec

    def new_recorder(self) -> None:
        """In a forked child: forget the parent's ring, create our own. Raises OSError.

        The child's ring is small and kept in memory (``lazy``, issue 13) until the child
        records something that matters (``ringsize.Growable.materialize``: an event other
        than its start or a clean exit, joining a group, the phase/step API, its memory
        sampler's first tick); a helper that lives less than a tick and exits cleanly
        (most DataLoader workers of short epochs) leaves no ring file. Without the memory
        sampler (``HANGTRACE_MEM=0``, no tick) the ring is written at once, as before.
        The recorder is the one the parent prepared before the fork (``prepare_child``),
        adopted, when there is one."""
        old = self.recorder
        old.abandon()
        self.parent_pid = old.pid
        self.log = RunLog(self.run_dir)
        ready, self._child_recorder = self._child_recorder, None
        if ready is not None and ready[0] == old.pid:  # (it has the parent's step: prepare_child)
            ready[1].adopt(self.log)
            self.recorder = ready[1]
        else:
            step = old.current()[1]
            self.recorder = self._make_recorder(lazy=config.mem_enabled())
            if step is not None:
                self.recorder.step(step, grow=False)
        self.recorder.on_lost = _disable_child

    def prepare_child(self) -> None:
        """In the parent, before a fork: the lazy recorder the child will ``adopt``
        (``ringsize.Growable.adopt``), built at the first fork and kept unused for every
        later one (each child adopts its own copy-on-write copy); before every fork it
        takes this process's current step (the child's records carry it). Without the memory
        sampler, or with helper rings as large as ranks', children's rings are not lazy
        (files at once): nothing is prepared.
        Raises OSError (no anonymous memory): the child then builds its own."""
        ready, choice = self._child_recorder, self._choice
        if (
            (ready is None or ready[0] != os.getpid())
            and config.mem_enabled()
            and choice is not None
            and choice[1] < choice[2]
        ):  # (a small ring: lazy)
            ready = self._child_recorder = (os.getpid(), self._make_recorder(lazy=True))
        if ready is not None and ready[0] == os.getpid():
            ready[1].inherit_step(self.recorder._step)


def _default_instrumentors() -> List[Instrumentor]:
    from hangtrace.hooks.env.envrecord import EnvRecordInstrumentor
    from hangtrace.hooks.process.failures import FailuresInstrumentor
    from hangtrace.hooks.libraries import RayInstrumentor, TorchDistInstrumentor
    from hangtrace.hooks.process.lifecycle import LifecycleInstrumentor
    from hangtrace.hooks.mem.memory import MemoryInstrumentor

    out: List[Instrumentor] = [
        LifecycleInstrumentor(),
        FailuresInstrumentor(),
        MemoryInstrumentor(),
        TorchDistInstrumentor(),
        RayInstrumentor(),
        EnvRecordInstrumentor(),
    ]
    if os.environ.get(config.DEEP):  # issue 11: viztracer's module only when asked for
        from hangtrace.hooks.deep import DeepInstrumentor

        out.append(DeepInstrumentor())
    return out


def _before_fork() -> None:
    """In the parent, on the forking thread, just before ``os.fork``: what the child's
    handler needs is imported once here instead of in every child (issue 13), and not at
    start-up (issue 8)."""
    try:
        mem = sys.modules.get("hangtrace.hooks.mem.memory")
        if state.active() is not None and mem is not None and mem.active() is not None:
            from hangtrace.hooks.mem import memfork  # noqa: F401  # the sampler's take-over, imported once here
    except Exception:
        pass
    try:
        rt = state.active()
        if rt is not None:
            rt.prepare_child()
    except Exception:
        pass


def _after_fork_child() -> None:
    """The ONE fork handler: the child's own ring, then every instrumentor in order."""
    rt = state.active()
    if rt is None:
        return
    _freeze_inherited()
    try:
        rt.new_recorder()
        api._set_recorder(rt.recorder)
    except Exception as e:
        _disable_child(e)
        return
    for ins in INSTRUMENTORS:
        ins.after_fork_child()


def _freeze_inherited() -> None:
    """In a forked child, before anything else: ``gc.freeze()`` (unless
    ``HANGTRACE_FORK_GC_FREEZE=0``), so that the child's cyclic collections never walk what
    it inherited. Why: a collection writes the header of every object it walks, and in a
    child each such write is a copy-on-write fault on a page of the parent's heap; measured
    in DataLoader workers of a traced DDP rank (gloo, MLP, 1 s epochs): about 4,150 minor
    faults per worker against 2,550 untraced, and 5-10 ms more CPU each, gone with the
    freeze (2,750 faults). CPython documents ``gc.freeze()`` for forked children for this
    reason (``gc`` module docs). ``freeze`` splices the generation lists: it touches list
    heads, not every object. Never raises."""
    try:
        if config.fork_gc_freeze():
            import gc

            gc.freeze()
    except Exception:
        pass


def _disable_child(e: BaseException) -> None:
    """A forked child whose own ring could not be created (at fork, or when its lazy ring
    was to be written): tracing off in it, one line on stderr. Takes no recorder lock."""
    state.set_active(None)
    api._set_recorder(None)
    # the parent's ring is still mapped here: no hook may write into it any more
    try:
        td = sys.modules.get("hangtrace.hooks.torchdist.torch_dist")
        if td is not None:
            setattr(td, "_state", None)  # (a module from sys.modules: typed ModuleType)
        mem = sys.modules.get("hangtrace.hooks.mem.memory")
        if mem is not None:
            mem._after_fork_child()
            s = mem.active()
            if s is not None:  # (the child's own sampler, taken over: it stops ticking)
                s.abandon()
        from hangtrace.hooks.process import lifecycle

        lifecycle.detach()
    except Exception:
        pass
    _warn("tracing disabled in forked child %d: %r" % (os.getpid(), e))


def _at_exit() -> None:
    """The ONE exit handler: every instrumentor's ``at_exit``, in reverse install order."""
    for ins in reversed(INSTRUMENTORS):
        ins.at_exit()


def _warn(msg: str) -> None:
    try:
        sys.stderr.write("hangtrace: %s\n" % msg)
    except Exception:
        pass


def activate() -> Optional[Runtime]:
    """Turn tracing on in this process (idempotent). Returns the Runtime or None."""
    global _failed_pid
    with _lock:
        current = state.active()
        if current is not None:
            return current
        if not config.enabled() or _failed_pid == os.getpid():
            return None  # (a .pth can be processed twice, e.g. in some venvs: warn once)
        if state.is_own_cli(getattr(sys, "orig_argv", ())):
            return None  # `hangtrace dump` etc. in a shell that exported HANGTRACE=1
        try:
            run_dir, run_id = resolve_run_dir()
            rt = Runtime(run_dir, run_id)
        except Exception as e:
            _failed_pid = os.getpid()
            _warn(
                "tracing disabled for pid %d: cannot create the flight record in %r: %s "
                "(remedy: set HANGTRACE_DIR to a writable directory with free space)"
                % (os.getpid(), os.environ.get(config.DIR), e)
            )
            return None
        state.set_active(rt)
        api._set_recorder(rt.recorder)
        try:
            if not INSTRUMENTORS:
                INSTRUMENTORS.extend(_default_instrumentors())
                atexit.register(_at_exit)
                os.register_at_fork(before=_before_fork, after_in_child=_after_fork_child)
        except Exception as e:
            rt.log("instrumentors, exit or fork handler failed: %r" % (e,), "instrumentors")
        for ins in INSTRUMENTORS:
            ins.install(rt)
        try:
            if os.environ.get(config.AUTO_WATCH, config.DEFAULTS[config.AUTO_WATCH]) != "0":
                preload.load("autowatch")
                from hangtrace.hooks import autowatch  # (not imported when auto-watch is off)

                autowatch.maybe_start(rt)
        except ImportError:
            pass
        except Exception as e:
            rt.log("starting the node watcher failed: %r" % (e,), "autowatch")
        return rt
