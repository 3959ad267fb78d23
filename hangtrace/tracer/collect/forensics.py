"""What each traced process is running: libraries, versions, environment (issue 12).

Two halves, both impure:

- **in the traced process** (``hooks/env/envcollect.py``, called by ``hooks/env/envrecord.py`` at
  bootstrap, at torch import, after fork and when ctypes loads a new library): read
  ``/proc/self/maps``, keep the executable file mappings (for naming a crashing frame
  after death) and the libraries that matter, stat them, read their GNU build-id with a
  few ``struct`` reads of the ELF program headers, mask the environment, write
  ``RUN_DIR/env/<host>-<pid>.json``. About 1–5 ms per call (``benchmarks/
  bench_forensics.py``); never raises. pyelftools is *not* used here: importing it alone
  costs more than the whole record (measured in the same benchmark).
- **out of process** (``load_env``, ``enrich``, ``symbolize``; ``elffacts``): pyelftools
  reads what a library states about itself (NCCL's "NCCL version" string), build-ids the
  fast reader missed, the build-ids of any other mapped library that the ranks map from
  different files (issue 41), and the symbol table entry that holds a code offset.

Module import is light (stdlib only); pyelftools is imported inside the functions that need it.
"""

import json
import os
import re
import socket
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from hangtrace.tracer import envfacts as E
from hangtrace.tracer.collect.elffacts import every_library

from hangtrace.hooks.env.envcollect import (  # noqa: F401 (the in-process half, re-exported)
    _build_id_in_notes,
    _library,
    _module_version,
    collect_self,
    matters,
    name_version,
    parse_maps,
    read_build_id,
    write,
)


def load_env(run_dir: str) -> Tuple[List[E.ProcessEnv], List[str]]:
    """Every env record of a run directory (or stored snapshot) as ``(records, errors)``;
    an unreadable file is one error line, never an exception."""
    out, errors = [], []
    d = os.path.join(run_dir, E.ENV_DIR)
    try:
        names = sorted(n for n in os.listdir(d) if n.endswith(".json"))
    except OSError:
        return [], []
    for n in names:
        p = os.path.join(d, n)
        try:
            with open(p, "rb") as f:
                out.append(E.from_json(json.loads(f.read()), path=p))
        except (OSError, ValueError, KeyError, TypeError) as e:
            errors.append("%s: unreadable env record (%s); left out of the comparison" % (p, e))
    return out, errors


def with_ranks(envs: Sequence[E.ProcessEnv], ranks: Dict[Tuple[str, int], int]) -> List[E.ProcessEnv]:
    """``envs`` with ``rank`` set from ``{(host, pid): rank}`` (the ring headers)."""
    return [pe._replace(rank=ranks.get((pe.host, pe.pid), -1)) for pe in envs]


def _same_file(lb: E.Library) -> bool:
    try:
        st = os.stat(lb.path)
    except OSError:
        return False
    return st.st_size == lb.size and st.st_mtime_ns == lb.mtime_ns and st.st_ino == lb.inode


_NCCL_VERSION = re.compile(rb"NCCL version (\d+\.\d+\.\d+)")


def stated_version(path: str) -> Optional[str]:
    """The version a library states inside itself, where we know how to read it: NCCL's
    ``"NCCL version X.Y.Z"`` string (printed by NCCL at init, in ``.rodata``), found with
    pyelftools in the read-only data sections. None otherwise or on error."""
    try:
        from elftools.elf.elffile import ELFFile

        with open(path, "rb") as f:
            elf = ELFFile(f)
            for name in (".rodata", ".rodata1"):
                sec = elf.get_section_by_name(name)
                if sec is not None:
                    m = _NCCL_VERSION.search(sec.data())
                    if m:
                        return m.group(1).decode()
    except Exception:  # pyelftools raises its own errors on odd files
        return None
    return None


def enrich(pe: E.ProcessEnv, host: Optional[str] = None) -> E.ProcessEnv:
    """``pe`` with what pyelftools adds, for libraries of this host whose file is still the
    one recorded (same size, mtime, inode): the build-id where the fast reader found
    none, and NCCL's stated version. Records of other hosts are returned unchanged."""
    if pe.host != (host or socket.gethostname()):
        return pe
    libs = []
    for lb in pe.libraries:
        if not _same_file(lb):
            libs.append(lb)
            continue
        bid = lb.build_id or _elftools_build_id(lb.path)
        ver, src = lb.version, lb.version_source
        if "nccl" in lb.name.lower():
            sv = stated_version(lb.path)
            if sv:
                ver, src = sv, "strings"
        libs.append(lb._replace(build_id=bid, version=ver, version_source=src))
    return pe._replace(libraries=tuple(libs))


def _elftools_build_id(path: str) -> Optional[str]:
    """Build-id through pyelftools' note iterator (the slow, thorough reader)."""
    try:
        from elftools.elf.elffile import ELFFile
        from elftools.elf.segments import NoteSegment

        with open(path, "rb") as f:
            for seg in ELFFile(f).iter_segments():
                if isinstance(seg, NoteSegment):  # what pyelftools makes of every PT_NOTE segment
                    for n in seg.iter_notes():
                        if n["n_type"] == "NT_GNU_BUILD_ID":
                            return str(n["n_desc"])
    except Exception:
        return None
    return None


def symbolize(path: str, file_offset: int) -> Optional[str]:
    """``symbol+0xOFF`` of the function holding ``file_offset`` (bytes into the file) of
    ELF ``path``, from ``.symtab`` (if not stripped) else ``.dynsym``, via pyelftools;
    None when no function symbol covers it or the file cannot be read. The offset is
    turned into a virtual address through the PT_LOAD segment that contains it."""
    try:
        from elftools.elf.elffile import ELFFile
        from elftools.elf.sections import SymbolTableSection

        with open(path, "rb") as f:
            elf = ELFFile(f)
            vaddr = None
            for seg in elf.iter_segments():
                if (
                    seg["p_type"] == "PT_LOAD"
                    and seg["p_offset"] <= file_offset < seg["p_offset"] + seg["p_filesz"]
                ):
                    vaddr = file_offset - seg["p_offset"] + seg["p_vaddr"]
                    break
            if vaddr is None:
                return None
            for name in (".symtab", ".dynsym"):
                sec = elf.get_section_by_name(name)
                if sec is None:
                    continue
                if not isinstance(sec, SymbolTableSection):
                    return None  # not a symbol table under that name: an unreadable file
                best = None
                for s in sec.iter_symbols():
                    if s["st_info"]["type"] != "STT_FUNC" or not s["st_value"]:
                        continue
                    lo = s["st_value"]
                    if lo <= vaddr < lo + max(1, s["st_size"]) and (best is None or lo > best[0]):
                        best = (lo, s.name)
                if best:
                    return "%s+0x%x" % (best[1], vaddr - best[0])
    except Exception:
        return None
    return None


def kernel_fault_text(pid: int, read_log: Optional[Callable[[], Tuple[list, str]]] = None) -> Tuple[str, str]:
    """Kernel log lines about ``pid``'s fatal fault (``segfault at``, ``trap``; printed by
    the kernel when ``/proc/sys/debug/exception-trace`` is 1, rate-limited) as
    ``(text, status)``; status is 'read' or why the log could not be read."""
    if read_log is None:
        from hangtrace.tracer.collect.memfacts import read_kernel_log

        read_log = read_kernel_log
    lines, status = read_log()
    tag = "[%d]" % pid
    keep = [
        t
        for _, t in lines
        if tag in t and (" segfault at " in t or " trap " in t or "general protection" in t)
    ]
    return "\n".join(keep), status


def run_env(
    path: str, enrich_local: bool = True, processes: Optional[Sequence[Any]] = None
) -> Tuple[List[E.ProcessEnv], List[str]]:
    """The env records of a run directory or stored snapshot (a snapshot without its own
    ``env/`` reads its run directory's), ranks joined from the ring headers, ``libraries``
    made every mapped shared object (``elffacts.every_library``: the build-ids of the
    libraries mapped from more than one file read here; a note per file it could not
    read, in the error lines) and, with
    ``enrich_local``, pyelftools facts added for this host's libraries (:func:`enrich`).
    ``processes``: the run's ``ProcessInfo`` list when the caller loaded it already (the
    rings are then not read a second time: at 4,096 ranks that was a whole second load).
    Returns ``(records, error lines)`` (no record: the rings are not read); never raises
    for unreadable files."""
    from hangtrace.tracer.collect import rings

    env_root = path
    if rings.is_snapshot(path) and not os.path.isdir(os.path.join(path, E.ENV_DIR)):
        env_root = os.path.dirname(os.path.dirname(os.path.abspath(path)))
    envs, errors = load_env(env_root)
    if not envs:  # nothing to compare: the error lines name only the unreadable records
        return [], errors
    ranks: Dict[Tuple[str, int], int] = {}
    try:
        procs: Sequence[Any] = processes if processes is not None else ()
        if processes is None:
            snap = (
                rings.load_snapshot(path)
                if rings.is_snapshot(path)
                else rings.load_run(path, live_facts=False)
            )
            procs = snap.processes
        # the process model: only the process that IS rank r compares as rank r (helpers
        # that inherited RANK - resource trackers, DataLoader workers - do not)
        from hangtrace.tracer.process_model import assign_roles

        model = assign_roles(list(procs))
        for q in procs:
            r: int = q.rank
            ranks[(q.host, q.pid)] = r if model.ranks.get(r) is q else -1
    except Exception as e:  # no ring: compare without ranks
        errors.append("ranks unknown (%s): processes are named by pid" % e)
    envs, notes = every_library(with_ranks(envs, ranks))
    errors += notes
    if enrich_local:
        envs = [enrich(pe) for pe in envs]
    return envs, errors


def kernel_fault(
    run_dir: str, host: str, pid: int, read_log: Optional[Callable[[], Tuple[list, str]]] = None
) -> Optional[Tuple[str, Sequence[E.Mapping]]]:
    """What names the native frame where process ``host:pid`` of ``run_dir`` took its fatal
    signal: ``(this host's kernel log line for it, the process's recorded executable
    mappings)``, for ``analyze.envdiff.fatal_frame_library``. None for another host, no
    kernel line (SIGABRT, rate limit, exception-trace off) or an unreadable log."""
    if host != socket.gethostname():
        return None
    envs, _ = load_env(run_dir)
    maps = next((pe.mappings for pe in envs if pe.host == host and pe.pid == pid), ())
    text, status = kernel_fault_text(pid, read_log)
    if status != "read" or not text:
        return None
    return text, maps
