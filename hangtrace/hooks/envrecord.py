"""Records what this traced process runs (issue 12): ``RUN_DIR/env/<host>-<pid>.json``.

Called from ``bootstrap`` at activation, when torch is imported, when a forked child
joins a process group (``joined``); and from a wrapper around ``ctypes.CDLL.__init__``
when a library not recorded yet gets loaded (torch loads its own libraries that way, and
so do jobs that load plugins). A crashed process's mappings are needed after its death
to name the crashing library, so they are written while it lives. A forked child maps
exactly what its parent mapped at the fork, so its record waits until it matters: it
joins a group (it is a rank: env-diff and the crash frame read ranks' records) or loads
a new library; a DataLoader worker that does neither writes none (about 2 ms of every
fork, issue 13). Nothing here is on the per-collective path. Never raises: a failure is
one line in the run log.
"""
from __future__ import annotations

import os
import threading
from typing import Any, Dict, FrozenSet, Optional, Tuple

_lock = threading.Lock()
_patched = [False]
_fork_pending = [False]  # a forked child whose record waits until it matters (module docstring)
#: (pid, mappings) of this process's last record (the record's ``[start, end, offset,
#: path]`` items), or None; its path and file-name sets are made when first asked (``_sets``)
_last: Optional[Tuple[int, list]] = None
#: (that _last, its paths, their file names), made from _last when first asked
_last_sets: Optional[Tuple[Any, FrozenSet[str], FrozenSet[str]]] = None
#: libraries read by this process (or by its parent before a fork: the same files are
#: mapped), by (path, inode): a repeated record reads only new files (about 1 ms a fork)
_known: Dict[Tuple[str, str], Dict[str, Any]] = {}


def record(rt: Any, reason: str) -> None:
    """Collect and write this process's facts now; ``rt`` is bootstrap's Runtime."""
    global _last, _last_sets
    _fork_pending[0] = False
    try:
        from hangtrace.hooks import envcollect
        with _lock:
            rec = envcollect.snapshot(reason, rt.recorder.host, _known)
            envcollect.write_record(rt.run_dir, rec)
            _last, _last_sets = (rec["pid"], rec["mappings"]), None
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


def joined() -> None:
    """This process joined a process group: a forked child writes its record now
    (reason ``fork+join``). Called by the torch.distributed hooks; never raises."""
    if not _fork_pending[0]:
        return
    try:
        from hangtrace.hooks import bootstrap
        rt = bootstrap.active()
        if rt is not None:
            record(rt, "fork+join")
    except Exception:
        pass


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
                    if _loaded_new(args[0] if args else kwargs.get("name")):
                        from . import bootstrap
                        cur = bootstrap.active()
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
    """Issue 12: the environment record of this process at start, when torch.distributed
    is imported (its libraries are mapped then), when a forked child joins a process
    group, and when ``ctypes`` loads a library not recorded yet. Off the per-collective
    path."""

    name = "env-record"

    def _install(self, runtime: Any) -> None:
        from hangtrace.hooks import importhook
        record(runtime, "bootstrap")
        install_ctypes_hook(runtime)
        importhook.when_imported("torch.distributed", lambda _m: record(runtime, "torch"))

    def _after_fork_child(self) -> None:
        _fork_pending[0] = True  # written by ``joined`` or a new library, not now
