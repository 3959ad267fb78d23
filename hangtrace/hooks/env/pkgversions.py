"""The installed versions of the Python packages this traced process has imported (issue 41),
for the environment record (``"packages"`` of ``RUN_DIR/env/<host>-<pid>.json``).

What. Every public top-level module in ``sys.modules`` (no leading ``_``) that is not part of
the standard library (``sys.stdlib_module_names``) and was imported from a directory holding installed
distributions (``site-packages``, a ``PYTHONPATH`` entry, a venv) gives one
``{distribution name: version}`` item. The distribution is the ``<name>-<version>.dist-info``
(or ``.egg-info``) directory beside the module whose normalized name (PEP 503: lower case,
runs of ``-_.`` as ``_``) is the module's; when none is, the ``top_level.txt`` files of that
directory's distributions name their modules (``yaml`` -> ``PyYAML``; read lazily, likely
names first: ``_top_level``). The version is the
one in the directory's name, which installers write from the wheel's own ``Version``
(PEP 427 / the binary distribution format: ``{distribution}-{version}.dist-info``), the
value ``importlib.metadata.version`` reads from its ``METADATA``; a directory whose name
states no version (``foo.egg-info``) is read for its ``Version:`` line. Modules without
installed metadata (a script's own modules, an editable install's source tree) and
namespace packages (no ``__file__``: their parts come from several distributions) are left
out.

Cost. ``importlib.metadata`` is not used: in a process with torch (measured 2026-12-07 on a
loaded machine, thread CPU) ``version()`` of its five packages took 5.3 ms (each call
searches ``sys.path`` and reads ``METADATA``) and ``packages_distributions()``, which maps
modules to distributions, 328 ms; all of this module's work, 0.7 ms. Here each directory is listed once per process (forks inherit
the caches) and each module is resolved once, so a repeated record costs a dict lookup per
loaded module (``benchmarks/bench_forensics.py``: ``packages-first``, ``packages-again``).
Standard library only; never raises (a failure leaves the module out).
"""

from __future__ import annotations

import os
import sys
from typing import Dict, Optional, Set, Tuple

#: directory -> {normalized distribution name: (name, version)} from its *-info names
_dists: Dict[str, Dict[str, Tuple[str, Optional[str], str]]] = {}
#: directory -> {top-level module: normalized distribution name} from the top_level.txt
#: files read so far, and the distributions whose file was read (or tried)
_tops: Dict[str, Dict[str, str]] = {}
_read: Dict[str, Set[str]] = {}
#: module name -> (distribution name, version) or None (no installed metadata)
_resolved: Dict[str, Optional[Tuple[str, str]]] = {}
_STD = frozenset(getattr(sys, "stdlib_module_names", ())) | frozenset(sys.builtin_module_names)


def normalize(name: str) -> str:
    """PEP 503 normalization (lower case, runs of ``-``, ``_``, ``.`` as one ``_``); string
    methods only (they run in C: a site-packages of 180 distributions is normalized at
    each process's first record)."""
    out = name.lower().replace("-", "_").replace(".", "_")
    while "__" in out:
        out = out.replace("__", "_")
    return out


def _index(d: str) -> Dict[str, Tuple[str, Optional[str], str]]:
    """``{normalized name: (name, version or None, info directory's name)}`` of directory ``d``."""
    got = _dists.get(d)
    if got is not None:
        return got
    got = {}
    try:
        names = os.listdir(d)
    except OSError:
        names = []
    for n in names:
        if n.endswith(".dist-info"):
            stem = n[: -len(".dist-info")]
        elif n.endswith(".egg-info"):
            stem = n[: -len(".egg-info")]
        else:
            continue
        name, _, version = stem.partition("-")
        if n.endswith(".egg-info") and "-py" in version:  # name-1.0-py3.11.egg-info
            version = version[: version.index("-py")]
        got[normalize(name)] = (name, version or None, n)  # (joined with d when read)
    _dists[d] = got
    return got


def _top_level(d: str, name: str) -> Optional[str]:
    """The normalized distribution in ``d`` whose ``top_level.txt`` lists module ``name``,
    or None. The files are read lazily, those of distributions whose name contains the
    module's or is contained in it first (``torch`` for ``torchgen``, ``pyyaml`` for
    ``yaml``: one read), the rest only when these do not list it; each file once."""
    got = _tops.get(d)
    if got is None:
        got = _tops[d] = {}
    if name in got:
        return got[name]
    done = _read.setdefault(d, set())
    nm = normalize(name)
    keys = sorted(_index(d), key=lambda k: not (k in nm or nm in k))
    for key in keys:
        if key in done:
            continue
        done.add(key)
        try:
            with open(os.path.join(d, _index(d)[key][2], "top_level.txt"), encoding="utf-8") as f:
                for line in f:
                    if line.strip():
                        got.setdefault(line.strip(), key)
        except OSError:
            continue
        if name in got:
            return got[name]
    return None


def _metadata_version(info: str) -> Optional[str]:
    """The ``Version:`` header of ``info``'s METADATA (dist-info) or PKG-INFO (egg-info)."""
    for fname in ("METADATA", "PKG-INFO"):
        try:
            with open(os.path.join(info, fname), encoding="utf-8", errors="replace") as f:
                for line in f:
                    if line.startswith("Version:"):
                        return line[len("Version:") :].strip() or None
                    if not line.strip():
                        break  # the headers end at the first blank line
        except OSError:
            continue
    return None


def _home(module: object) -> Optional[str]:
    """The directory ``module`` was imported from (the parent of a package's folder), or
    None for a module without a file: a namespace package (``google``: its parts belong to
    several distributions, none of them its version), a built-in or frozen module."""
    f = getattr(module, "__file__", None)
    if not isinstance(f, str):
        return None
    d = os.path.dirname(f)
    return os.path.dirname(d) if os.path.basename(f).startswith("__init__.") else d


def resolve(name: str, module: object) -> Optional[Tuple[str, str]]:
    """``(distribution name, version)`` of top-level module ``name``, or None."""
    d = _home(module)
    if not d:
        return None
    dists = _index(d)
    hit = dists.get(normalize(name))
    if hit is None:
        key = _top_level(d, name)
        hit = dists.get(key) if key is not None else None
    if hit is None:
        return None
    version = hit[1] or _metadata_version(os.path.join(d, hit[2]))
    return (hit[0], version) if version else None


def loaded_packages() -> Dict[str, str]:
    """``{distribution name: version}`` of the imported top-level modules (module
    docstring). Each module is resolved once per process; never raises."""
    out: Dict[str, str] = {}
    try:
        mods = sys.modules
        # (a set comprehension over the names, in C mostly: about 1,500 modules with torch)
        for name in {n for n in list(mods) if "." not in n and n[:1] != "_"} - _STD:
            if name in _resolved:
                hit = _resolved[name]
            else:
                mod = mods.get(name)
                if mod is None:
                    continue
                try:
                    hit = resolve(name, mod)
                except Exception:
                    hit = None
                _resolved[name] = hit
            if hit is not None:
                out[hit[0]] = hit[1]
    except Exception:
        pass
    return out
