"""Records what this traced process runs (issue 12): ``RUN_DIR/env/<host>-<pid>.json``.

When. A crashed process's mappings are needed after its death to name the crashing
library, so they are written while it lives, but only once the process matters (issue 8:
a record costs about 3M instructions, ~1.5 ms, and a start wrote three of them before
``import torch.distributed`` returned):

* a process started traced keeps its record pending (``_pending == "start"``) until the
  first of: it joins a process group (``joined``, it is a rank: env-diff and the crash
  frame read ranks' records), its memory sampler's first timer tick (it has lived one
  ``HANGTRACE_MEM_INTERVAL_S``, default 1 s: ``lived``), or it exits with a non-zero code
  or an uncaught exception (``at_exit``). Without the memory sampler (``HANGTRACE_MEM=0``,
  no tick) it is written at start, as before. Libraries loaded while pending need no
  record of their own: the pending one, written later, maps them.
* a forked child maps exactly what its parent mapped at the fork, so its record
  (``_pending == "fork"``) waits until it joins a group or loads a new library; a
  DataLoader worker that does neither writes none (about 2 ms of every fork, issue 13).
* once written, the record is written again when torch.distributed is imported (its
  libraries are mapped then) and when ``ctypes.CDLL`` loads a library not recorded yet
  (torch loads its own libraries that way, and so do jobs that load plugins).

What a process that ends within its first second, cleanly and without joining a group,
leaves: no record (a native crash in that second is still named by the kernel's fault
line, without the symbol the mappings would give). Nothing here is on the per-collective
path. Never raises: a failure is one line in the run log.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Dict, FrozenSet, List, Optional, Tuple

from hangtrace.hooks import state

_lock = threading.Lock()
_patched = [False]
#: the record waits until the process matters (module docstring): "start" (a process
#: started traced), "fork" (a forked child), or None (written, or never deferred)
_pending: List[Optional[str]] = [None]
#: (pid, mappings) of this process's last record (the record's ``[start, end, offset,
#: path]`` items), or None; its path and file-name sets are made when first asked (``_sets``)
_last: Optional[Tuple[int, list]] = None
#: the environment (``os.environ``) at this process's last record, or [None]
_last_environ: List[Optional[Dict[str, str]]] = [None]
#: (that _last, its paths, their file names), made from _last when first asked
_last_sets: Optional[Tuple[Any, FrozenSet[str], FrozenSet[str]]] = None
#: libraries read by this process (or by its parent before a fork: the same files are
#: mapped), by (path, inode): a repeated record reads only new files (about 1 ms a fork)
_known: Dict[Tuple[str, str], Dict[str, Any]] = {}


def record(rt: Any, reason: str) -> None:
    """Collect and write this process's facts now; ``rt`` is bootstrap's Runtime."""
    global _last, _last_sets
    _pending[0] = None
    try:
        from hangtrace.hooks.env import envcollect

        with _lock:
            environ = dict(os.environ)
            rec = envcollect.snapshot(reason, rt.recorder.host, _known)
            envcollect.write_record(rt.run_dir, rec)
            _last, _last_sets = (rec["pid"], rec["mappings"]), None
            _last_environ[0] = environ
    except Exception as e:
        try:
            rt.log("environment record failed: %r" % (e,), "env-record")
        except Exception:
            pass


def _sets() -> Optional[Tuple[FrozenSet[str], FrozenSet[str]]]:
    """(paths, file names) of the mappings of this process's last record, or None when this
    process wrote none. Made at the first question after a record, not at every record."""
    global _last_sets
    last, sets = _last, _last_sets
    if last is None or last[0] != os.getpid():
        return None
    if sets is None or sets[0] is not last:  # (another thread may have recorded since)
        paths = frozenset(m[3] for m in last[1])
        sets = _last_sets = (last, paths, frozenset(p.rpartition("/")[2] for p in paths))
    return sets[1], sets[2]


def recorded_paths() -> FrozenSet[str]:
    """The mapped files of this process's last record (empty when none was written)."""
    sets = _sets()
    return sets[0] if sets is not None else frozenset()


def _claim(kinds: Tuple[str, ...]) -> bool:
    """True (and nothing pending any more) when the pending record is of one of ``kinds``;
    one caller wins when two threads ask at once (a join and the sampler's first tick)."""
    with _lock:
        if _pending[0] in kinds:
            _pending[0] = None
            return True
        return False


def _record_active(reason: str) -> None:
    try:
        rt = state.active()
        if rt is not None:
            record(rt, reason)
    except Exception:
        pass


def joined() -> None:
    """This process joined a process group: a pending record is written now (reason
    ``join``, or ``fork+join`` in a forked child); a written one again when the environment
    changed since (a Ray actor that lived past its first sampler tick and then set
    MASTER_ADDR/MASTER_PORT in its ``setup``: env-diff compared its old environment with its
    peers' and said it ran without them, blind helper 86). Called by the torch.distributed
    hooks; never raises."""
    kind = _pending[0]
    if kind is not None and _claim((kind,)):
        _record_active("fork+join" if kind == "fork" else "join")
    elif (
        kind is None
        and _last is not None
        and _last[0] == os.getpid()
        and _last_environ[0] is not None
        and _last_environ[0] != dict(os.environ)
    ):
        _record_active("join")


def lived() -> None:
    """The process has lived one memory-sampler interval (the sampler's first timer tick):
    a record pending since its start is written now (reason ``lived``); a forked child's
    still waits. Never raises."""
    if _pending[0] == "start" and _claim(("start",)):
        _record_active("lived")


def _loaded_new(name: Any) -> bool:
    """True when ``ctypes.CDLL(name)`` loaded a file not mapped at this process's last
    record (a path is compared resolved, a bare name by file name)."""
    if not isinstance(name, str):
        return False  # CDLL(None): the program itself, already mapped
    sets = _sets()
    if sets is None:
        return True
    if os.sep in name:
        return os.path.realpath(name) not in sets[0]
    return name not in sets[1]


def install_ctypes_hook(rt: Any) -> None:
    """Wrap ``ctypes.CDLL.__init__`` (when ctypes is imported) so that loading a library
    not yet recorded records again. Idempotent."""

    def hook(module: Any) -> None:
        if _patched[0]:
            return
        try:
            import functools

            original = module.CDLL.__init__

            # a plain function, not wrapt: importing wrapt here (ctypes is imported early
            # in torch's import) pulled in importlib.metadata before torch needed it
            @functools.wraps(original)
            def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
                original(self, *args, **kwargs)
                try:
                    # (pending since the start: the record, when written, maps it)
                    if _pending[0] != "start" and _loaded_new(args[0] if args else kwargs.get("name")):
                        cur = state.active()
                        if cur is not None:
                            record(cur, "ctypes")
                except Exception:
                    pass

            module.CDLL.__init__ = __init__
            _patched[0] = True
        except Exception as e:
            rt.log("ctypes hook failed: %r" % (e,), "env-ctypes")

    try:
        import sys

        if "ctypes" in sys.modules:
            hook(sys.modules["ctypes"])
        else:
            from hangtrace.hooks import importhook  # not wrapt.importer: see importhook's docstring

            importhook.when_imported("ctypes", hook)
    except Exception as e:
        rt.log("ctypes hook failed: %r" % (e,), "env-ctypes")


# --- the instrumentor (hooks/instrument.py contract) -------------------------------------
from hangtrace.hooks.instrument import Instrumentor  # noqa: E402


class EnvRecordInstrumentor(Instrumentor):
    """Issue 12: the environment record of this process once it matters (module
    docstring): at a group join, after one sampler interval, at an abnormal exit; again
    when torch.distributed is imported or ``ctypes`` loads a library not recorded yet.
    Off the per-collective path. Installed after the memory instrumentor (its tick)."""

    name = "env-record"

    def _install(self, runtime: Any) -> None:
        import sys
        from hangtrace.hooks import importhook

        mem = sys.modules.get("hangtrace.hooks.mem.memory")
        sampler = mem.active() if mem is not None else None
        if sampler is not None:
            _pending[0] = "start"
            sampler.on_first_tick.append(lived)
        else:  # no timer to write it later (HANGTRACE_MEM=0): now
            record(runtime, "bootstrap")
        install_ctypes_hook(runtime)
        importhook.when_imported("torch.distributed", self._on_torch)

    def _on_torch(self, _module: Any) -> None:
        """torch.distributed imported: its libraries are mapped; a written record is
        renewed, a pending one will map them when written."""
        if _pending[0] is None and self.runtime is not None:
            record(self.runtime, "torch")

    def _after_fork_child(self) -> None:
        _pending[0] = "fork"  # written by ``joined`` or a new library, not now

    def _at_exit(self) -> None:
        """A process ending with a non-zero code or an uncaught exception (lifecycle's
        exit code) writes its pending record now: env-diff explains failures too."""
        import sys

        lc = sys.modules.get("hangtrace.hooks.process.lifecycle")
        code = lc.exit_code() if lc is not None else None
        if code and _claim(("start",)) and self.runtime is not None:
            record(self.runtime, "exit")
