"""Post-import hooks of our own: call ``fn(module)`` once a named module has been imported.

Replaces ``wrapt.register_post_import_hook``: importing ``wrapt.importer`` costs about
60 ms and 3 MB at start-up here (it imports ``importlib.metadata`` and with it the
``email`` package; measured with ``python -X importtime``), in every traced process,
even those that never import torch or Ray.

How: ``PathFinder.find_spec`` (the stdlib finder of ``sys.path`` and package
``__path__`` entries, the one that finds torch, Ray and the standard library) is
replaced by a classmethod that calls the original and, for a hooked name only, wraps the
spec's loader (PEP 451), so that after the module's own ``exec_module`` ran, the hooks
fire with the finished module. A hooked name that ``PathFinder`` does not find is asked
of the finders after it in ``sys.meta_path`` (setuptools' editable finder), as before.
The original loader is put back on the module (``__loader__``, ``__spec__.loader``)
before the module runs, so nothing downstream sees ours. A module already imported when
its hook is registered gets the hook at once. Hooks run once per process; their
exceptions are swallowed (the caller logs its own).

Why not a finder of our own at the front of ``sys.meta_path`` (the previous way): every
import then paid for one more ``sys.meta_path`` entry - ``importlib``'s loop takes the
import lock around each finder - about 5,500 instructions per module, 5M of a traced
``import torch.distributed`` (1,100 modules); the wrapped classmethod costs one C call
per module (``_fastrec.FindSpec``; one Python call without the extension). What that
changes: a hooked module served by a finder placed *before* ``PathFinder`` (a custom
import system inserted at the front) is no longer seen. Where
``PathFinder`` is not in ``sys.meta_path`` at all, the front finder is still used.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any, Callable, Dict, List, Optional, Sequence

from hangtrace.tracer import config as _config

Hook = Callable[[ModuleType], None]

_hooks: Dict[str, List[Hook]] = {}
_before: Dict[str, List[Callable[[str], None]]] = {}  # name -> fn(name), run as its import starts


class _Loader:
    """Wraps a module's loader; fires the post-import hooks after ``exec_module``."""

    def __init__(self, loader: Any, name: str) -> None:
        self.loader = loader
        self.name = name

    def create_module(self, spec: Any) -> Optional[ModuleType]:
        create = getattr(self.loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        try:
            module.__loader__ = self.loader
            spec = getattr(module, "__spec__", None)
            if spec is not None:
                spec.loader = self.loader
        except Exception:
            pass
        for fn in _before.pop(self.name, []):
            try:
                fn(self.name)
            except Exception:
                pass
        self.loader.exec_module(module)
        _fire(self.name, sys.modules.get(self.name, module))

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.loader, attr)


class _Finder:
    """The ``sys.meta_path`` entry: wraps the loader of hooked module names only."""

    def __init__(self) -> None:
        self.busy: set = set()

    def find_spec(self, fullname: str, path: Optional[Sequence[str]] = None, target: Any = None) -> Any:
        if fullname not in _hooks or fullname in self.busy:
            return None
        self.busy.add(fullname)
        try:
            for finder in list(sys.meta_path):
                if finder is self or isinstance(finder, _Finder):
                    continue
                fs = getattr(finder, "find_spec", None)
                if fs is None:
                    continue
                spec = fs(fullname, path, target)
                if spec is not None:
                    if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                        spec.loader = _Loader(spec.loader, fullname)
                    return spec
            return None
        finally:
            self.busy.discard(fullname)

    def invalidate_caches(self) -> None:
        pass


_finder: Optional[_Finder] = None  # the front finder, only where PathFinder is not in sys.meta_path
_path_finder: Any = None  # the PathFinder class whose find_spec we replaced, or None
_original: Any = None  # its own find_spec (the classmethod object), restored by clear()
_busy: set = set()  # hooked names being looked up by us (re-entry guard)


def _hooked_spec(fullname: str, spec: Any, path: Any, target: Any) -> Any:
    """``spec`` (PathFinder's answer for hooked name ``fullname``) with its loader wrapped;
    when PathFinder found nothing, the finders after it in ``sys.meta_path`` are asked."""
    if fullname in _busy:
        return spec
    _busy.add(fullname)
    try:
        if spec is None:
            mp = list(sys.meta_path)
            later = mp[mp.index(_path_finder) + 1 :] if _path_finder in mp else []
            for finder in later:
                fs = getattr(finder, "find_spec", None)
                if fs is not None:
                    spec = fs(fullname, path, target)
                    if spec is not None:
                        break
        if (
            spec is not None
            and spec.loader is not None
            and hasattr(spec.loader, "exec_module")
            and not isinstance(spec.loader, _Loader)
        ):
            spec.loader = _Loader(spec.loader, fullname)
        return spec
    finally:
        _busy.discard(fullname)


def _install_path_hook() -> bool:
    """Replace ``PathFinder.find_spec`` (once); False when PathFinder is not in
    ``sys.meta_path`` (then the front finder is used)."""
    global _path_finder, _original
    if _path_finder is not None:
        return True
    pf = getattr(sys.modules.get("_frozen_importlib_external"), "PathFinder", None)
    if pf is None or pf not in sys.meta_path:
        return False
    original = pf.__dict__.get("find_spec")
    if not isinstance(original, classmethod):
        return False  # replaced by someone else already: leave it, use the front finder
    find = original.__get__(None, pf)  # the bound original: PathFinder.find_spec(name, path, target)
    pf.find_spec = classmethod(_wrapper(find))
    _path_finder, _original = pf, original
    return True


def _wrapper(find: Any) -> Any:
    """The replacement of ``PathFinder.find_spec``, given its bound original ``find``:
    ``_fastrec.FindSpec`` (no Python frame in each of the ~1,100 imports of a torch
    process) unless ``HANGTRACE_PURE_PYTHON`` is set or the extension is not built; else
    the same in Python."""
    hooks = _hooks
    if not _config.pure_python():
        try:
            from hangtrace.hooks import _fastrec

            return _fastrec.FindSpec(find, hooks, _hooked_call)
        except Exception:
            pass

    def find_spec(cls: Any, fullname: str, path: Any = None, target: Any = None) -> Any:
        spec = find(fullname, path, target)
        if fullname in hooks:
            return _hooked_spec(fullname, spec, path, target)
        return spec

    find_spec.__doc__ = find.__doc__
    return find_spec


def _hooked_call(spec: Any, fullname: str, path: Any = None, target: Any = None) -> Any:
    return _hooked_spec(fullname, spec, path, target)


def _fire(name: str, module: ModuleType) -> None:
    for fn in _hooks.pop(name, []):
        try:
            fn(module)
        except Exception:
            pass


def when_imported(name: str, fn: Hook, before: Optional[Callable[[str], None]] = None) -> None:
    """Call ``fn(module)`` once module ``name`` is imported (at once if it is already).

    ``name``: a full module name ("torch.distributed", "ray"). ``before``: called with
    ``name`` as the module's own code starts to run (not when it is only looked up, as
    ``importlib.util.find_spec`` does); not called when it is imported already. Never
    raises.
    """
    global _finder
    module = sys.modules.get(name)
    if module is not None:
        try:
            fn(module)
        except Exception:
            pass
        return
    _hooks.setdefault(name, []).append(fn)
    if before is not None:
        _before.setdefault(name, []).append(before)
    try:
        if _install_path_hook():
            return
    except Exception:
        pass
    if _finder is None or _finder not in sys.meta_path:
        _finder = _Finder()
        sys.meta_path.insert(0, _finder)


def clear() -> None:
    """Forget every pending hook, restore ``PathFinder.find_spec`` and remove the front
    finder (tests, uninstall)."""
    global _finder, _path_finder, _original
    _hooks.clear()
    _before.clear()
    if _path_finder is not None:
        _path_finder.find_spec = _original
        _path_finder = _original = None
    if _finder is not None and _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
    _finder = None
