"""The file contract for environment forensics (issue 12): ``RUN_DIR/env/<host>-<pid>.json``.

One JSON file per traced process, rewritten (atomically: temporary file + rename) each
time the process records its facts: at bootstrap, when torch is imported, after a fork
and when ``ctypes`` loads a library not seen before. The collector and ``hangtrace
env-diff`` read it into the frozen dataclasses below; nothing else crosses the boundary.

Secrets: the value of every recorded environment variable whose name contains TOKEN,
KEY, SECRET, PASSWORD or CREDENTIAL (case-insensitive) is replaced by :data:`MASK` before
anything is written (:func:`mask_environ`). The names, the schema number and the masking
rule live in ``tracer/envformat.py`` (re-exported here), which is all a traced process
imports: the writer (``hooks/env/envcollect.py``) builds the JSON without these classes. The
records are typed, immutable ``NamedTuple``s (``_replace`` gives a changed copy).
"""

import functools
import os
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Tuple

from hangtrace.tracer.envformat import (
    ENV_DIR,  # noqa: F401
    ENV_NAMES,  # noqa: F401
    ENV_PREFIXES,  # noqa: F401
    MASK,
    SCHEMA,  # noqa: F401
    SECRET_WORDS,  # noqa: F401
    env_path,  # noqa: F401
    is_job_relevant,  # noqa: F401
    is_secret_name,
    mask_environ,  # noqa: F401
)


class Mapping(NamedTuple):
    """One executable, file-backed mapping of /proc/PID/maps (proc(5)).

    ``start``/``end``: virtual addresses (bytes); ``offset``: file offset (bytes) mapped
    at ``start``; ``path``: the file as the kernel names it (symlinks resolved)."""

    start: int
    end: int
    offset: int
    path: str


class Library(NamedTuple):
    """A shared library mapped by the process: in the record, the ones that matter for
    distributed jobs (``hooks/env/envcollect.matters``); after the analysis reads the
    record (``collect/elffacts.py``), every mapped shared object (issue 41).

    ``size``/``mtime_ns``/``inode`` identify the file as it was when recorded (bytes,
    ns since the epoch); ``build_id``: GNU build-id (hex) from the ELF note
    ``NT_GNU_BUILD_ID`` or None; ``version``: the version the library states, with
    ``version_source`` ('file name', 'strings' for NCCL's "NCCL version" text)."""

    path: str
    size: int = -1
    mtime_ns: int = 0
    inode: int = 0
    build_id: Optional[str] = None
    version: Optional[str] = None
    version_source: Optional[str] = None
    #: why ``build_id`` is None when the analysis could not read the file (issue 41:
    #: "vanished since the run", "not an ELF file", ...); None when read or never tried
    note: Optional[str] = None
    #: the ``DT_SONAME`` when the analysis compares the library under it (issue 41:
    #: ``collect/elffacts.py``), else None; not part of the record
    soname: Optional[str] = None

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    @property
    def key(self) -> str:
        """The name (the soname when set) without version suffix: ``libnccl.so.2.21.5`` ->
        ``libnccl.so``."""
        return _key(self.soname, self.path)


@functools.lru_cache(maxsize=1 << 16)
def _key(soname: Optional[str], path: str) -> str:
    """``Library.key``, once per (soname, path): the environment comparison asks it ~340
    times per rank (at 512 ranks, 3 % of the analysis)."""
    return key_of(soname or os.path.basename(path))


def key_of(name: str) -> str:
    """A library file name or soname without its version suffix: ``libnccl.so.2`` ->
    ``libnccl.so``."""
    i = name.find(".so")
    return name[: i + 3] if i >= 0 else name


class ProcessEnv(NamedTuple):
    """What one traced process was running. ``rank`` is -1 until joined with the ring
    (the loader fills it from the ring header: a rank is a process that joined a group).
    ``environ``: (name, value) pairs, secret-looking values already masked.
    ``wall_ns``: when recorded (ns since the epoch); ``reason``: what triggered it;
    ``files``/``packages``: see below (issue 41)."""

    host: str
    pid: int
    rank: int = -1
    python: str = ""
    executable: str = ""
    torch: Optional[str] = None
    ray: Optional[str] = None
    libraries: Tuple[Library, ...] = ()
    environ: Tuple[Tuple[str, str], ...] = ()
    mappings: Tuple[Mapping, ...] = ()
    wall_ns: int = 0
    reason: str = ""
    path: Optional[str] = None  # where it was read from (not part of the record)
    #: (path, inode) of every mapped file, as /proc/PID/maps named them (issue 41; empty in
    #: records of older versions)
    files: Tuple[Tuple[str, int], ...] = ()
    #: (distribution, version) of the imported Python packages (``hooks/env/pkgversions``)
    packages: Tuple[Tuple[str, str], ...] = ()
    #: the framework modules (``envformat.FRAMEWORK_MODULES``) loaded when recorded (issue 37;
    #: empty in records of older versions)
    frameworks: Tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return "%s:%d" % (self.host, self.pid)


def to_json(pe: ProcessEnv) -> Dict[str, Any]:
    """A JSON-ready dict (schema :data:`SCHEMA`); values of secret names are masked again."""
    return {
        "schema": SCHEMA,
        "host": pe.host,
        "pid": pe.pid,
        "python": pe.python,
        "executable": pe.executable,
        "torch": pe.torch,
        "ray": pe.ray,
        "wall_ns": pe.wall_ns,
        "reason": pe.reason,
        "environ": {k: (MASK if is_secret_name(k) else v) for k, v in pe.environ},
        "libraries": [
            {
                "path": lb.path,
                "size": lb.size,
                "mtime_ns": lb.mtime_ns,
                "inode": lb.inode,
                "build_id": lb.build_id,
                "version": lb.version,
                "version_source": lb.version_source,
            }
            for lb in pe.libraries
        ],
        "mappings": [[m.start, m.end, m.offset, m.path] for m in pe.mappings],
        "files": {p: str(i) for p, i in pe.files},
        "packages": dict(pe.packages),
        "frameworks": list(pe.frameworks),
    }


def _opt(v: Any) -> Optional[str]:
    return None if v is None else str(v)


def from_json(d: Dict[str, Any], path: Optional[str] = None) -> ProcessEnv:
    """Parse one env file's dict. Raises ValueError (or KeyError/TypeError, both caught
    by the loader) when it is not a schema-1 record."""
    if not isinstance(d, dict) or d.get("schema") != SCHEMA:
        raise ValueError("not an env record of schema %d" % SCHEMA)
    libs = tuple(
        Library(
            path=str(x["path"]),
            size=int(x.get("size", -1)),
            mtime_ns=int(x.get("mtime_ns", 0)),
            inode=int(x.get("inode", 0)),
            build_id=_opt(x.get("build_id")),
            version=_opt(x.get("version")),
            version_source=_opt(x.get("version_source")),
        )
        for x in d.get("libraries", [])
    )
    maps = tuple(Mapping(int(a), int(b), int(c), str(p)) for a, b, c, p in d.get("mappings", []))
    env = tuple(
        sorted(
            (str(k), MASK if is_secret_name(str(k)) else str(v))
            for k, v in dict(d.get("environ", {})).items()
        )
    )
    return ProcessEnv(
        host=str(d["host"]),
        pid=int(d["pid"]),
        python=str(d.get("python", "")),
        executable=str(d.get("executable", "")),
        torch=_opt(d.get("torch")),
        ray=_opt(d.get("ray")),
        libraries=libs,
        environ=env,
        mappings=maps,
        wall_ns=int(d.get("wall_ns", 0)),
        reason=str(d.get("reason", "")),
        path=path,
        files=tuple(sorted((str(p), int(i)) for p, i in dict(d.get("files", {})).items())),
        packages=tuple(sorted((str(k), str(v)) for k, v in dict(d.get("packages", {})).items())),
        frameworks=tuple(str(m) for m in d.get("frameworks") or () if isinstance(m, str)),
    )


def unique(items: Iterable[str]) -> List[str]:
    seen: List[str] = []
    for i in items:
        if i not in seen:
            seen.append(i)
    return seen
