"""The in-process half of issue 12's environment record: what this traced process is
running - the executable file mappings and their inodes (for naming a crashing frame after
death; for any library's build-id, read at analysis time: issue 41), the
libraries that matter with their GNU build-id (a few ``struct`` reads of the ELF program
headers; pyelftools is *not* used here: importing it alone costs more than the whole
record, ``benchmarks/bench_forensics.py``), versions, the installed versions of the
imported Python packages (``pkgversions``) and the masked job environment -
written to ``RUN_DIR/env/<host>-<pid>.json`` (contract: ``tracer/envfacts.py``).

Called by ``hooks/env/envrecord.py`` at start-up and when torch is imported, so it is built
for start-up cost (``benchmarks/bench_startup.py``): the record is made as the JSON dict
itself (:func:`snapshot`), not through ``tracer/envfacts.py``'s typed classes (creating
them costs about 1 ms; they are made only by :func:`collect_self`, for readers and
tests); no regular expression is compiled; the text of ``/proc/self/maps`` is not split
into lines: the executable lines are found with ``str.find`` and only those the previous
record did not see are parsed, and the libraries it read (same path and
inode) are not read again; the ``env`` directory is made once per run directory. The
caches are module state: callers serialize (``envrecord`` holds its lock). Standard library only, imported in traced processes. The
out-of-process half (reading, enriching with pyelftools, differences) is
``tracer/collect/forensics.py``.
"""

from __future__ import annotations

import os
import struct
import sys
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from hangtrace.hooks.env import pkgversions
from hangtrace.tracer import envformat as EF
from hangtrace.tracer.envformat import matters  # noqa: F401 (re-exported)

if TYPE_CHECKING:  # pragma: no cover
    from hangtrace.tracer import envfacts as E

#: One executable file mapping: (start, end, file offset) in bytes, path.
MapTuple = Tuple[int, int, int, str]
#: A library as written in the record (the "libraries" items of the JSON, docs/FORMAT.md).
LibDict = Dict[str, Any]

_matters: Dict[str, bool] = {}  # path -> matters(path), for every path seen by this process
#: the candidate lines of the maps text read last by this process (or its parent before a
#: fork): their parse, None for a line that is not an executable file mapping
_exec: Dict[str, Optional[Tuple[MapTuple, str]]] = {}
_dirs_made: set = set()  # env directories made by this process (or its parent before a fork)


def name_version(name: str) -> Optional[str]:
    """The version in a library's file name: ``libnccl.so.2.21.5`` -> ``"2.21.5"``; three
    or more numeric parts after ``.so.`` (``libfoo.so.1.0`` is an ABI number: None)."""
    i = name.find(".so.")
    while i >= 0:
        rest = name[i + 4 :]
        parts = rest.split(".")
        if len(parts) >= 3 and all(p.isdecimal() and p.isascii() for p in parts):
            return rest
        i = name.find(".so.", i + 1)
    return None


def _parse_line(line: str) -> Tuple[Optional[MapTuple], str]:
    """One /proc/PID/maps line (proc(5): ``start-end perms offset dev inode path``):
    ``(mapping, inode)`` for an executable file-backed mapping, else ``(None, "")``."""
    parts = line.split(None, 5)
    if len(parts) < 6 or "x" not in parts[1] or not parts[5].startswith("/"):
        return None, ""
    a, _, b = parts[0].partition("-")
    try:
        return (int(a, 16), int(b, 16), int(parts[2], 16), parts[5].rstrip()), parts[4]
    except ValueError:
        return None, ""


def _candidate_lines(text: str) -> List[str]:
    """The lines of a maps text that contain ``"xp "`` or ``"xs "`` (executable private or
    shared mappings, and the odd path containing either), in text order. Found with
    ``str.find`` (in C) instead of splitting the whole text: about 90 of a torch
    process's ~400 lines."""
    spans: Dict[int, int] = {}  # line start -> line end (offsets into text)
    for pat in ("xp ", "xs "):
        i = text.find(pat)
        while i >= 0:
            start = text.rfind("\n", 0, i) + 1
            end = text.find("\n", i)
            if end < 0:
                end = len(text)
            spans[start] = end
            i = text.find(pat, end)
    return [text[a : spans[a]] for a in sorted(spans)]


def exec_mappings(text: str) -> List[Tuple[MapTuple, str]]:
    """``(mapping, inode)`` of every executable, file-backed mapping of a /proc/PID/maps
    text, in address order. Only the lines that were not in the previous call's text are
    parsed: a record after torch's import parses its ~50 new executable lines, not the
    ~350 lines of the maps. Not thread-safe (module cache): ``envrecord`` calls it under
    its lock."""
    global _exec
    old = _exec
    cache: Dict[str, Optional[Tuple[MapTuple, str]]] = {}  # this text's candidate lines only
    out: List[Tuple[MapTuple, str]] = []
    last = -1
    ordered = True
    for line in _candidate_lines(text):
        if line in old:
            hit = old[line]
        else:
            m, inode = _parse_line(line)
            hit = (m, inode) if m is not None else None
        cache[line] = hit
        if hit is not None:
            out.append(hit)
            ordered = ordered and hit[0][0] >= last
            last = hit[0][0]
    _exec = cache
    return out if ordered else sorted(out)  # (the kernel's text is in address order)


def parse_maps(text: str) -> List[E.Mapping]:
    """Executable, file-backed mappings of a /proc/PID/maps text (proc(5) format
    ``start-end perms offset dev inode path``), in address order."""
    from hangtrace.tracer import envfacts as E

    return [E.Mapping(*m) for m, _ in exec_mappings(text)]


def read_build_id(path: str) -> Optional[str]:
    """GNU build-id (lowercase hex) of an ELF file from its PT_NOTE segments, or None.

    Reads the ELF header, the program headers and the note segments only (a few KiB,
    whatever the file's size). Format: the System V ABI (ELF header, Elf{32,64}_Phdr)
    and ``NT_GNU_BUILD_ID`` = 3 with owner "GNU" (binutils ``ld --build-id``).
    Returns None for non-ELF files or any read error."""
    try:
        with open(path, "rb") as f:
            ident = f.read(64)
            if ident[:4] != b"\x7fELF" or len(ident) < 52:
                return None
            is64, end = ident[4] == 2, "<" if ident[5] == 1 else ">"
            if is64:
                (phoff,) = struct.unpack_from(end + "Q", ident, 32)
                phentsize, phnum = struct.unpack_from(end + "HH", ident, 54)
            else:
                (phoff,) = struct.unpack_from(end + "I", ident, 28)
                phentsize, phnum = struct.unpack_from(end + "HH", ident, 42)
            if not phoff or phnum == 0 or phnum > 4096:
                return None
            f.seek(phoff)
            ph = f.read(phentsize * phnum)
            for i in range(phnum):
                o = i * phentsize
                if struct.unpack_from(end + "I", ph, o)[0] != 4:  # PT_NOTE
                    continue
                if is64:
                    off, filesz = (
                        struct.unpack_from(end + "Q", ph, o + 8)[0],
                        struct.unpack_from(end + "Q", ph, o + 32)[0],
                    )
                else:
                    off, filesz = (
                        struct.unpack_from(end + "I", ph, o + 4)[0],
                        struct.unpack_from(end + "I", ph, o + 16)[0],
                    )
                f.seek(off)
                bid = _build_id_in_notes(f.read(min(filesz, 1 << 16)), end)
                if bid:
                    return bid
    except (OSError, struct.error, ValueError):
        return None
    return None


def _build_id_in_notes(buf: bytes, end: str) -> Optional[str]:
    pos = 0
    while pos + 12 <= len(buf):
        namesz, descsz, ntype = struct.unpack_from(end + "III", buf, pos)
        name_at = pos + 12
        desc_at = name_at + ((namesz + 3) & ~3)
        if ntype == 3 and buf[name_at : name_at + namesz].rstrip(b"\0") == b"GNU":
            return buf[desc_at : desc_at + descsz].hex() or None
        pos = desc_at + ((descsz + 3) & ~3)
    return None


def library_dict(path: str) -> LibDict:
    """The record of library file ``path`` now: size (bytes), mtime (ns), inode, build-id,
    version from the file name (the JSON form of ``envfacts.Library``)."""
    try:
        st = os.stat(path)
        size, mtime, ino = st.st_size, st.st_mtime_ns, st.st_ino
    except OSError:
        size, mtime, ino = -1, 0, 0
    v = name_version(os.path.basename(path))
    return {
        "path": path,
        "size": size,
        "mtime_ns": mtime,
        "inode": ino,
        "build_id": read_build_id(path),
        "version": v,
        "version_source": "file name" if v else None,
    }


def _library(path: str) -> E.Library:
    from hangtrace.tracer import envfacts as E

    return E.Library(**library_dict(path))


def _module_version(name: str) -> Optional[str]:
    mod = sys.modules.get(name)
    v = getattr(mod, "__version__", None) if mod is not None else None
    return str(v) if v is not None else None


def read_maps() -> str:
    """``/proc/self/maps`` as text. Raises OSError."""
    fd = os.open("/proc/self/maps", os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while True:
            b = os.read(fd, 1 << 16)
            if not b:
                break
            chunks.append(b)
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "replace")


def snapshot(
    reason: str, host: str, known: Optional[Dict[Tuple[str, str], LibDict]] = None
) -> Dict[str, Any]:
    """This process's record now, as the JSON dict (schema ``envformat.SCHEMA``).

    ``known``: libraries already read, by (path, inode as /proc/self/maps names it); the
    ones read now are added to it, so a repeated record reads only new files (None: read
    every library afresh). Raises OSError when /proc/self/maps cannot be read."""
    maps = exec_mappings(read_maps())
    known = {} if known is None else known
    cache = _matters
    libs: List[LibDict] = []
    done = set()
    for m, inode in maps:
        path = m[3]
        if path in done:
            continue
        done.add(path)
        hit = cache.get(path)
        if hit is None:
            hit = cache[path] = matters(path)
        if hit:
            lb = known.get((path, inode))
            if lb is None:
                lb = known[(path, inode)] = library_dict(path)
            libs.append(lb)
    return {
        "schema": EF.SCHEMA,
        "host": host,
        "pid": os.getpid(),
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "torch": _module_version("torch"),
        "ray": _module_version("ray"),
        "wall_ns": time.time_ns(),
        "reason": reason,
        "environ": dict(EF.mask_environ(os.environ)),
        "libraries": libs,
        "mappings": [m for m, _ in maps],
        # every mapped file's inode as the maps name it: the analysis reads the build-id of
        # any library later and must know the file is still the one mapped (issue 41)
        "files": {m[3]: inode for m, inode in maps},
        "packages": pkgversions.loaded_packages(),
        # the training frameworks loaded (issue 37): their versions are in "packages"
        "frameworks": [m for m in EF.FRAMEWORK_MODULES if m in sys.modules],
    }  # (JSON arrays: tuples serialize as lists)


def collect_self(
    reason: str, host: Optional[str] = None, previous: Optional[E.ProcessEnv] = None
) -> E.ProcessEnv:
    """This process's facts now, typed (readers, tests, benchmarks; the hooks write
    :func:`snapshot`'s dict). Libraries already in ``previous`` (same path and inode) are
    reused, so a repeated record reads only new files. Raises OSError when /proc/self/maps
    cannot be read."""
    from hangtrace.tracer import envfacts as E

    known: Optional[Dict[Tuple[str, str], LibDict]] = None
    if previous is not None:
        known = {(lb.path, str(lb.inode)): lb._asdict() for lb in previous.libraries}
    return E.from_json(snapshot(reason, host or os.uname().nodename, known))


def write_record(run_dir: str, record: Dict[str, Any]) -> str:
    """Write a :func:`snapshot` dict to ``RUN_DIR/env/<host>-<pid>.json`` atomically (mode
    0600; the directory 0700, made once); returns the path. Raises OSError."""
    import json  # (imported already in a traced process: the recorder's events use it)

    d = os.path.join(run_dir, EF.ENV_DIR)
    if d not in _dirs_made:
        os.makedirs(d, mode=0o700, exist_ok=True)
        _dirs_made.add(d)
    path = EF.env_path(run_dir, record["host"], record["pid"])
    tmp = "%s.tmp%d" % (path, os.getpid())
    data = json.dumps(record, separators=(",", ":")).encode()
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except FileNotFoundError:  # the directory went away (a test, a clean-up): make it again
        _dirs_made.discard(d)
        os.makedirs(d, mode=0o700, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return path


def write(run_dir: str, pe: E.ProcessEnv) -> str:
    """Write ``pe`` to ``RUN_DIR/env/<host>-<pid>.json`` atomically (mode 0600); returns
    the path. Raises OSError."""
    from hangtrace.tracer import envfacts as E

    return write_record(run_dir, E.to_json(pe))
