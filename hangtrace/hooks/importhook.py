"""Post-import hooks of our own: call ``fn(module)`` once a named module has been imported.

Replaces ``wrapt.register_post_import_hook``: importing ``wrapt.importer`` costs about
60 ms and 3 MB at start-up here (it imports ``importlib.metadata`` and with it the
``email`` package; measured with ``python -X importtime``), in every traced process,
even those that never import torch or Ray.

How: one finder at the front of ``sys.meta_path``. For a hooked name it asks the
finders behind it for the spec (PEP 451) and wraps the spec's loader, so that after the
module's own ``exec_module`` ran, the hooks fire with the finished module. The original
loader is put back on the module (``__loader__``, ``__spec__.loader``) before the module
runs, so nothing downstream sees ours. For every other import the cost is one dict
lookup. A module already imported when its hook is registered gets the hook at once.
Hooks run once per process; their exceptions are swallowed (the caller logs its own).
"""
from __future__ import annotations

import sys
from types import ModuleType
from typing import Any, Callable, Dict, List, Optional, Sequence

Hook = Callable[[ModuleType], None]

_hooks: Dict[str, List[Hook]] = {}


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


_finder: Optional[_Finder] = None


def _fire(name: str, module: ModuleType) -> None:
    for fn in _hooks.pop(name, []):
        try:
            fn(module)
        except Exception:
            pass


def when_imported(name: str, fn: Hook) -> None:
    """Call ``fn(module)`` once module ``name`` is imported (at once if it is already).

    ``name``: a full module name ("torch.distributed", "ray"). Never raises.
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
    if _finder is None or _finder not in sys.meta_path:
        _finder = _Finder()
        sys.meta_path.insert(0, _finder)


def clear() -> None:
    """Forget every pending hook and remove the finder (tests, uninstall)."""
    global _finder
    _hooks.clear()
    if _finder is not None and _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
    _finder = None
