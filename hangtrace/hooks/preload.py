"""The start-up bundle: our in-process modules run from one file, without ``importlib``.

Why (issue 8, start-up at most 10 ms heavier): importing a module through ``importlib``
costs about 0.33M instructions of machinery whatever the module's size - finding it on
its package path, the module lock, the spec and its attributes, the ``.pyc``'s stat,
read and validation - measured under callgrind with 20 empty modules of a package
(6.9M; executing the same 20 code objects from one marshalled file: 0.3M). A traced
``import torch.distributed`` imports 27 of ours: about 9M of the 28M instructions we
added to its start (``benchmarks/startup_segments.py``).

How: ``build()`` compiles each group's modules (``GROUPS``) from their sources where they
are installed and writes one file per group, ``hooks/__pycache__/startup-<group>.<tag>.bundle``:
``marshal`` of (the interpreter's bytecode magic, its ``-O`` level, the entries), each entry
(module name, source path, source ``st_mtime_ns``, source size, is a package, code).
``load(group)`` checks every entry's source against its stat (one ``os.stat`` each) and,
when all match, runs the modules not yet imported in the listed order: a module object
with the ``__spec__``, ``__loader__`` (a ``SourceFileLoader`` of its source: ``reload``,
``inspect`` and tracebacks work as usual), ``__file__`` and ``__path__`` an import gives
it, put in ``sys.modules`` before its code runs, as an import does. A bundled module
that another one imports before its turn (an import cycle, or a group out of order) is served from the bundle by a finder at the front of
``sys.meta_path`` while ``load`` runs, and only then.

Never wrong, at worst slower: a missing, stale (any source changed), foreign
(another interpreter version or ``-O`` level) or unreadable bundle loads nothing, and the
modules are imported as usual; a module whose code raises is taken out of ``sys.modules``
and the rest of its group is left to ``import`` (which raises the same error where the
caller handles it). ``load`` never raises.

Who builds it: ``scripts/setup.sh`` and ``hangtrace run`` (``refresh()``: only stale or
missing groups; a read-only install keeps importing as usual), and the test suite at its
start. Standard library only (``marshal``, ``os``, ``sys``): imported in every traced
process, before anything else of ours but the two package ``__init__`` modules.
"""

from __future__ import annotations

import marshal
import os
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

# Each group in the order its modules run: a module after those it imports at its top.
# A group holds only what its trigger always imports. "activate": what bootstrap.activate()
# imports (the .pth imports hangtrace, hangtrace.hooks, bootstrap and this module the usual
# way); "fastrec": the C recorder's methods, imported by hooks/record/recorder.py when the
# C extension is built; "torch" and "ray": what their post-import hooks import
# (hooks/libraries.py); "autowatch": hooks/autowatch.py, when the node watcher is on.
GROUPS: Dict[str, Tuple[str, ...]] = {
    "activate": (
        "hangtrace.tracer.config",
        "hangtrace.tracer.api",
        "hangtrace.tracer",
        "hangtrace.hooks.state",
        "hangtrace.hooks.instrument",
        "hangtrace.tracer.ring",
        "hangtrace.tracer.ring.layout",
        "hangtrace.hooks.record",
        "hangtrace.hooks.record.ringsize",
        "hangtrace.hooks.record.entries",
        "hangtrace.hooks.record.recorder",
        "hangtrace.hooks.importhook",
        "hangtrace.hooks.process",
        "hangtrace.hooks.process.failures",
        "hangtrace.hooks.env",
        "hangtrace.hooks.env.envrecord",
        "hangtrace.hooks.libraries",
        "hangtrace.hooks.process.faultline",
        "hangtrace.hooks.process.patching",
        "hangtrace.hooks.process.lifecycle",
        "hangtrace.hooks.mem",
        "hangtrace.hooks.mem.cgroup",
        "hangtrace.hooks.mem.torchcuda",
        "hangtrace.hooks.mem.sampler",
        "hangtrace.hooks.mem.memory",
        "hangtrace.hooks.mem.memclock",
    ),
    "fastrec": ("hangtrace.hooks.record.fastrecorder",),
    "autowatch": ("hangtrace.hooks.autowatch",),
    "torch": (
        "hangtrace.hooks.torchdist",
        "hangtrace.hooks.torchdist.torch_specs",
        "hangtrace.hooks.torchdist.torch_state",
        "hangtrace.hooks.torchdist.torch_completion",
        "hangtrace.hooks.torchdist.torch_dist",
        "hangtrace.hooks.torchdist.torch_groups",
        "hangtrace.hooks.torchdist.torch_batch",
        "hangtrace.hooks.torchdist.torch_install",
        "hangtrace.hooks.process.workersignals",
    ),
    "ray": (
        "hangtrace.hooks.rayhooks",
        "hangtrace.hooks.rayhooks.ray_hooks",
        "hangtrace.hooks.rayhooks.ray_calls",
        "hangtrace.hooks.rayhooks.ray_create",
        "hangtrace.hooks.rayhooks.ray_install",
    ),
}
MARK = "hangtrace-startup-bundle"  # the ``__spec__.loader_state`` of a module run from a bundle

_ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)  # the directory holding hangtrace/
_status: Dict[str, str] = {}  # group -> what its last load() found ("loaded N", "stale: ...", ...)

Entry = Tuple[str, str, int, int, bool, Any]  # (name, source path, mtime_ns, size, is package, code)


def source_path(name: str) -> Tuple[str, bool]:
    """``(path of the module's source, is a package)`` for a ``hangtrace...`` module name."""
    base = os.path.join(_ROOT, *name.split("."))
    if os.path.isdir(base):
        return os.path.join(base, "__init__.py"), True
    return base + ".py", False


def bundle_path(group: str) -> str:
    """Where ``group``'s bundle lives: beside our ``.pyc`` files, tagged by interpreter."""
    tag = sys.implementation.cache_tag or "none"
    return os.path.join(_ROOT, "hangtrace", "hooks", "__pycache__", "startup-%s.%s.bundle" % (group, tag))


def _magic() -> bytes:
    return bytes(sys.modules["_frozen_importlib_external"].MAGIC_NUMBER)


def build(groups: Optional[Sequence[str]] = None) -> List[str]:
    """Compile and write the bundles of ``groups`` (default: all); returns their paths.

    Each file is written to a temporary name and renamed over the old one, so a process
    starting meanwhile reads the old bundle or the new one, never half of one. Raises
    OSError (unwritable install), SyntaxError (a module that does not compile)."""
    out = []
    for group in GROUPS if groups is None else groups:
        entries: List[Entry] = []
        for name in GROUPS[group]:
            path, is_pkg = source_path(name)
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                src = f.read()
            code = compile(src, path, "exec", dont_inherit=True, optimize=-1)
            entries.append((name, path, st.st_mtime_ns, st.st_size, is_pkg, code))
        dest = bundle_path(group)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        tmp = "%s.%d.tmp" % (dest, os.getpid())
        try:
            with open(tmp, "wb") as f:
                f.write(marshal.dumps((_magic(), sys.flags.optimize, entries)))
            os.replace(tmp, dest)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        out.append(dest)
    return out


def _read(group: str) -> Optional[List[Entry]]:
    """The group's entries when its bundle is there and every source unchanged, else None
    (the reason in ``_status``). Never raises."""
    try:
        with open(bundle_path(group), "rb") as f:
            magic, optimize, entries = marshal.loads(f.read())
    except FileNotFoundError:
        _status[group] = "missing"
        return None
    except Exception as e:
        _status[group] = "unreadable: %r" % (e,)
        return None
    if magic != _magic() or optimize != sys.flags.optimize:
        _status[group] = "built by another interpreter or -O level"
        return None
    if [e[0] for e in entries] != list(GROUPS.get(group, ())):
        _status[group] = "built for another module list"
        return None
    for name, path, mtime_ns, size, _pkg, _code in entries:
        try:
            st = os.stat(path)
        except OSError:
            _status[group] = "stale: %s is gone" % path
            return None
        if st.st_mtime_ns != mtime_ns or st.st_size != size:
            _status[group] = "stale: %s changed" % path
            return None
    return entries


def fresh(group: str) -> bool:
    """Whether ``group``'s bundle is there and matches every source. Never raises."""
    return _read(group) is not None


def refresh() -> List[str]:
    """Build the groups whose bundle is missing or stale; returns the paths written.
    Raises OSError or SyntaxError as ``build`` does."""
    stale = [g for g in GROUPS if not fresh(g)]
    return build(stale) if stale else []


def status() -> Dict[str, str]:
    """What each ``load`` of this process found, by group (for tests and diagnostics)."""
    return dict(_status)


def _loader(name: str, path: str) -> Any:
    """The loader an import gives a module of ours: a ``SourceFileLoader`` of its source."""
    return sys.modules["_frozen_importlib_external"].SourceFileLoader(name, path)


def _module(entry: Entry) -> Any:
    """A new module for ``entry`` with the attributes an import would give it."""
    name, path, _m, _s, is_pkg, _code = entry
    boot = sys.modules["_frozen_importlib"]
    loader = _loader(name, path)
    spec = boot.ModuleSpec(name, loader, origin=path, loader_state=MARK, is_package=is_pkg)
    spec.has_location = True
    mod = type(sys)(name)
    mod.__spec__ = spec
    mod.__loader__ = loader
    mod.__file__ = path
    mod.__package__ = name if is_pkg else name.rpartition(".")[0]
    if is_pkg:
        mod.__path__ = [os.path.dirname(path)]
        spec.submodule_search_locations = mod.__path__
    return mod


def _run(entry: Entry) -> Any:
    """Run one entry's code as its module; binds it on its parent package. Raises what the
    module's code raises (the module is then taken out of ``sys.modules``)."""
    name = entry[0]
    mod = _module(entry)
    sys.modules[name] = mod
    try:
        exec(entry[5], mod.__dict__)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    mod = sys.modules.get(name, mod)  # (a module may replace itself, as with an import)
    parent, _, child = name.rpartition(".")
    if parent in sys.modules:
        setattr(sys.modules[parent], child, mod)
    return mod


def _bind(entries: List[Entry]) -> None:
    """Each module as an attribute of its package, as an import leaves it (a module that ran
    before its package, such as ``tracer.api`` before ``tracer``, had none to be bound to)."""
    for entry in entries:
        parent, _, child = entry[0].rpartition(".")
        mod, pkg = sys.modules.get(entry[0]), sys.modules.get(parent)
        if mod is not None and pkg is not None and getattr(pkg, child, None) is not mod:
            setattr(pkg, child, mod)


class _Cycles:
    """Finder and loader at the front of ``sys.meta_path`` while ``load`` runs: serves,
    through ``importlib``, a bundled module that another one imports before its turn."""

    def __init__(self, entries: Dict[str, Entry]) -> None:
        self.entries = entries

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        entry = self.entries.get(fullname)
        if entry is None or fullname in sys.modules:
            return None
        spec = sys.modules["_frozen_importlib"].ModuleSpec(
            fullname, self, origin=entry[1], loader_state=MARK, is_package=entry[4]
        )
        spec.has_location = True
        return spec

    def create_module(self, spec: Any) -> Any:
        return None  # (importlib's default module, its attributes set from the spec)

    def exec_module(self, module: Any) -> None:
        entry = self.entries[module.__name__]
        loader = _loader(entry[0], entry[1])
        module.__loader__ = loader
        module.__spec__.loader = loader
        exec(entry[5], module.__dict__)


def load(group: str) -> int:
    """Run ``group``'s modules from its bundle (those not imported yet); returns how many
    ran. Nothing when the bundle is missing, stale or foreign. Never raises."""
    try:
        entries = _read(group)
        if entries is None:
            return 0
        cycles = _Cycles({e[0]: e for e in entries})
        sys.meta_path.insert(0, cycles)
        n = 0
        try:
            for entry in entries:
                if entry[0] not in sys.modules:
                    _run(entry)
                    n += 1
            _bind(entries)
        finally:
            try:
                sys.meta_path.remove(cycles)
            except ValueError:
                pass
        _status[group] = "loaded %d" % n
        return n
    except Exception as e:  # (a module's own error: left to its import, which raises it again)
        _status[group] = "stopped: %r" % (e,)
        return 0
