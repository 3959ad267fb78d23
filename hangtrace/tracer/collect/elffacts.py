"""Every mapped shared object of every traced process, for env-diff (issue 41).

A record (``RUN_DIR/env/<host>-<pid>.json``) carries a build-id only for the libraries
that matter (``envformat.matters``: torch, NCCL, CUDA, ...), read in the process; of every
other executable mapping it has the path and the inode (``files``). Here, at analysis
time and off the traced processes, each record's ``libraries`` become every mapped shared
object, and the GNU build-id of a library is read with pyelftools (``NT_GNU_BUILD_ID``
note of a ``PT_NOTE`` segment) where it tells something: for the libraries whose name
(``Library.key``: the file name without its version suffix) the processes map from
different files (other paths, or one path with another inode on one host). A library every
process maps from one file is not read (reading all of a torch process's ~65 mapped
files with pyelftools takes about a second; the few that differ, milliseconds).

Names: a library is compared under its file name without the version suffix, or, when
only some ranks map a file of that name, under its ``DT_SONAME`` (pyelftools, the
``PT_DYNAMIC`` segment) if that names it otherwise: a copy renamed on disk is compared
with the library it replaces.

A file is read only on the host that recorded it, and only when it is still the file that
was mapped (the recorded inode); otherwise ``Library.note`` says why its build-id is
unknown ("vanished since the run", "replaced since the run", "not an ELF file",
"unreadable: ...", "recorded on host b", "deleted while mapped") and the file is compared
by path alone; ``no GNU build-id`` is a fact, compared like one. Never raises.
"""

import os
import socket
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

from hangtrace.hooks.env.envcollect import name_version
from hangtrace.tracer import envfacts as E

NO_BUILD_ID = "no GNU build-id"
#: (path, inode, size, mtime_ns) -> (build-id, note): files already read by this process
_cache: Dict[Tuple[str, int, int, int], Tuple[Optional[str], Optional[str]]] = {}
#: executable mappings that are no shared object of anyone's making
_NOT_FILES = ("/memfd:", "/dev/", "/SYSV", "/proc/")
_DELETED = " (deleted)"


def elf_build_id(path: str) -> Tuple[Optional[str], Optional[str]]:
    """``(build-id hex, None)``, or ``(None, why)`` for the file ``path`` through pyelftools:
    ``why`` is :data:`NO_BUILD_ID`, ``"not an ELF file"`` or ``"unreadable: <reason>"``."""
    try:
        from elftools.common.exceptions import ELFError
        from elftools.elf.elffile import ELFFile
        from elftools.elf.segments import NoteSegment
    except ImportError as e:  # (a dependency of hangtrace: a broken install)
        return None, "unreadable: pyelftools missing (%s); pip install pyelftools" % e
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"\x7fELF":
                return None, "not an ELF file"
            f.seek(0)
            for seg in ELFFile(f).iter_segments():
                if isinstance(seg, NoteSegment):
                    for n in seg.iter_notes():
                        if n["n_type"] == "NT_GNU_BUILD_ID" and n["n_desc"]:
                            return str(n["n_desc"]), None
    except ELFError as e:
        return None, "not an ELF file (%s)" % e
    except OSError as e:
        return None, "unreadable: %s" % (e.strerror or e)
    except Exception as e:  # pyelftools' own errors on damaged files
        return None, "unreadable: %r" % (e,)
    return None, NO_BUILD_ID


def read_library(path: str, inode: int) -> Tuple[Optional[str], Optional[str]]:
    """``(build-id, note)`` of the file ``path`` mapped with ``inode`` (0: unknown) on this
    host: the note says why the build-id is None (module docstring)."""
    if path.endswith(_DELETED):
        return None, "deleted while mapped"
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None, "vanished since the run"
    except OSError as e:
        return None, "unreadable: %s" % (e.strerror or e)
    if inode and st.st_ino != inode:
        return None, "replaced since the run (inode %d then, %d now)" % (inode, st.st_ino)
    key = (path, st.st_ino, st.st_size, st.st_mtime_ns)
    got = _cache.get(key)
    if got is None:
        got = _cache[key] = elf_build_id(path)
    return got


def is_shared_object(path: str) -> bool:
    """True for the executable mappings compared across ranks: files, not memfd or devices."""
    return not path.startswith(_NOT_FILES)


def mapped_libraries(pe: E.ProcessEnv) -> Tuple[E.Library, ...]:
    """Every mapped shared object of ``pe`` (its recorded libraries with their facts, the
    other mappings with path and inode only), in mapping order."""
    recorded = {lb.path: lb for lb in pe.libraries}
    inodes = dict(pe.files)
    out: List[E.Library] = []
    seen: Set[str] = set()
    for p in [m.path for m in pe.mappings] + list(recorded):
        if p in seen or not is_shared_object(p):
            continue
        seen.add(p)
        lb = recorded.get(p)
        if lb is None:
            v = name_version(os.path.basename(p))
            lb = E.Library(
                path=p, inode=inodes.get(p, 0), version=v, version_source="file name" if v else None
            )
        out.append(lb)
    return tuple(out)


def _ambiguous(envs: Sequence[E.ProcessEnv]) -> Set[str]:
    """The library keys that the processes mapping them map from different files: another
    set of paths (a process mapping two files of one name, ``_C.cpython-311-*.so`` of two
    packages, is one set), or one path with two inodes on one host (the same path on two
    hosts is one file as far as can be told here: its inodes are of two file systems)."""
    paths: Dict[str, Set[frozenset]] = {}
    inodes: Dict[Tuple[str, str, str], Set[int]] = {}
    for pe in envs:
        mine: Dict[str, Set[str]] = {}
        for lb in pe.libraries:
            mine.setdefault(lb.key, set()).add(lb.path)
            inodes.setdefault((lb.key, pe.host, lb.path), set()).add(lb.inode)
        for k, v in mine.items():
            paths.setdefault(k, set()).add(frozenset(v))
    out = {k for k, v in paths.items() if len(v) > 1}
    return out | {k for (k, _, _), v in inodes.items() if len(v) > 1}


def elf_soname(path: str) -> Optional[str]:
    """The ``DT_SONAME`` of ELF file ``path`` (its ``PT_DYNAMIC`` segment, through
    pyelftools), or None: none, not ELF, unreadable."""
    try:
        from elftools.elf.dynamic import DynamicSegment
        from elftools.elf.elffile import ELFFile

        with open(path, "rb") as f:
            if f.read(4) != b"\x7fELF":
                return None
            f.seek(0)
            for seg in ELFFile(f).iter_segments():
                if isinstance(seg, DynamicSegment):  # (what pyelftools makes of PT_DYNAMIC)
                    for tag in seg.iter_tags():
                        if tag.entry.d_tag == "DT_SONAME":  # (pyelftools sets .soname on these)
                            name = getattr(tag, "soname", None)
                            return str(name) if name else None
    except Exception:  # (OSError, pyelftools' own errors on damaged files)
        return None
    return None


def read_soname(path: str, inode: int) -> Optional[str]:
    """:func:`elf_soname` of ``path`` while it is still the file mapped with ``inode``."""
    try:
        if path.endswith(_DELETED) or (inode and os.stat(path).st_ino != inode):
            return None
    except OSError:
        return None
    return elf_soname(path)


def _partial(envs: Sequence[E.ProcessEnv]) -> Set[str]:
    """The library keys that some of ``envs`` map and others do not."""
    keys = [{lb.key for lb in pe.libraries} for pe in envs]
    every = set.intersection(*keys) if keys else set()
    return set().union(*keys) - every


def _by_soname(
    full: List[E.ProcessEnv], compared: Set[int], here: str, soname: Callable[[str, int], Optional[str]]
) -> List[E.ProcessEnv]:
    """``full`` with ``Library.soname`` set where a library some compared processes map and
    others do not has a ``DT_SONAME`` naming it otherwise (``libhtprobe_v2.so`` built as
    ``libhtprobe.so``): it is then compared under that name. Read on this host only."""
    partial = _partial([full[i] for i in sorted(compared)])
    out = []
    for i, pe in enumerate(full):
        if i in compared and pe.host == here and any(lb.key in partial for lb in pe.libraries):
            libs = []
            for lb in pe.libraries:
                name = soname(lb.path, lb.inode) if lb.key in partial else None
                libs.append(lb._replace(soname=name) if name and E.key_of(name) != lb.key else lb)
            pe = pe._replace(libraries=tuple(libs))
        out.append(pe)
    return out


def every_library(
    envs: Sequence[E.ProcessEnv],
    host: Optional[str] = None,
    read: Callable[[str, int], Tuple[Optional[str], Optional[str]]] = read_library,
    soname: Callable[[str, int], Optional[str]] = read_soname,
) -> Tuple[List[E.ProcessEnv], List[str]]:
    """``envs`` with ``libraries`` = every mapped shared object, compared by name: the file
    name without its version suffix, or the ``DT_SONAME`` of a library that only some of the
    compared processes map by its file name (``soname``: :func:`read_soname`); the
    build-ids of the libraries the compared processes (the ranks when any are known, else
    all, as ``analyze.envdiff.diff_env``) map from different files read on this host
    (``host``: this machine's name by default; ``read``: :func:`read_library`). Returns
    ``(records, notes)``: one note per file whose build-id stays unknown, naming it, why
    and who mapped it."""
    here = host or socket.gethostname()
    full = [pe._replace(libraries=mapped_libraries(pe)) for pe in envs]
    ranked = {i for i, pe in enumerate(full) if pe.rank >= 0}
    compared = ranked or set(range(len(full)))  # as diff_env
    full = _by_soname(full, compared, here, soname)
    todo = _ambiguous([full[i] for i in sorted(compared)])
    out: List[E.ProcessEnv] = []
    unread: Dict[Tuple[str, str], List[E.ProcessEnv]] = {}
    for i, pe in enumerate(full):
        libs = []
        for lb in pe.libraries:
            if lb.key in todo and lb.build_id is None and i in compared:
                if pe.host == here:
                    bid, note = read(lb.path, lb.inode)
                else:
                    bid, note = None, "recorded on host %s" % pe.host
                lb = lb._replace(build_id=bid, note=note)
                if note and note != NO_BUILD_ID:
                    unread.setdefault((lb.path, note), []).append(pe)
            libs.append(lb)
        out.append(pe._replace(libraries=tuple(libs)))
    notes = [
        "%s: build-id unknown (%s), compared by path only (%s)" % (path, note, _whom(pes))
        for (path, note), pes in sorted(unread.items())
    ]
    return out, notes


def _whom(pes: Sequence[E.ProcessEnv]) -> str:
    ranks = sorted({pe.rank for pe in pes if pe.rank >= 0})
    if ranks:
        return "rank%s %s" % ("s" if len(ranks) > 1 else "", ", ".join(str(r) for r in ranks))
    return "pid%s %s" % ("s" if len(pes) > 1 else "", ", ".join(str(pe.pid) for pe in pes))
