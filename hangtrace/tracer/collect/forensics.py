"""What each traced process is running: libraries, versions, environment (issue 12).

Two halves, both impure:

- **in the traced process** (``record``, called by ``hooks/envrecord.py`` at bootstrap,
  at torch import, after fork and when ctypes loads a new library): read
  ``/proc/self/maps``, keep the executable file mappings (for naming a crashing frame
  after death) and the libraries that matter, stat them, read their GNU build-id with a
  few ``struct`` reads of the ELF program headers, mask the environment, write
  ``RUN_DIR/env/<host>-<pid>.json``. About 1–5 ms per call (``benchmarks/
  bench_forensics.py``); never raises. pyelftools is *not* used here: importing it alone
  costs more than the whole record (measured in the same benchmark).
- **out of process** (``load_env``, ``enrich``, ``symbolize``): pyelftools reads what a
  library states about itself (NCCL's "NCCL version" string), build-ids the fast reader
  missed, and the symbol table entry that holds a code offset.

Module import is light (stdlib only); pyelftools is imported inside the functions that need it.
"""
import dataclasses
import json
import os
import re
import socket
import struct
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from hangtrace.tracer import envfacts as E

_MATTER = re.compile(r"^(libtorch|libc10|libnccl|libgloo|libcuda|libcudart|libnvidia-ml|libibverbs|"
                     r"libmpi|libpython|libc\.so|libc-)|nccl|cuda", re.IGNORECASE)
_NAME_VERSION = re.compile(r"\.so\.(\d+\.\d+\.\d+(?:\.\d+)*)$")  # 3+ parts: 2.21.5, not an ABI 1.0


def matters(path: str) -> bool:
    """True for libraries named in issue 12: torch, c10, NCCL, gloo, CUDA, NVML, ibverbs,
    MPI, the Python runtime, libc, and any library whose name mentions nccl or cuda."""
    return bool(_MATTER.search(os.path.basename(path)))


def parse_maps(text: str) -> List[E.Mapping]:
    """Executable, file-backed mappings of a /proc/PID/maps text (proc(5) format
    ``start-end perms offset dev inode path``), in address order."""
    out = []
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6 or "x" not in parts[1] or not parts[5].startswith("/"):
            continue
        a, _, b = parts[0].partition("-")
        try:
            out.append(E.Mapping(int(a, 16), int(b, 16), int(parts[2], 16), parts[5].rstrip()))
        except ValueError:
            continue
    return out


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
                phoff, = struct.unpack_from(end + "Q", ident, 32)
                phentsize, phnum = struct.unpack_from(end + "HH", ident, 54)
            else:
                phoff, = struct.unpack_from(end + "I", ident, 28)
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
                    off, filesz = struct.unpack_from(end + "Q", ph, o + 8)[0], struct.unpack_from(end + "Q", ph, o + 32)[0]
                else:
                    off, filesz = struct.unpack_from(end + "I", ph, o + 4)[0], struct.unpack_from(end + "I", ph, o + 16)[0]
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
        if ntype == 3 and buf[name_at:name_at + namesz].rstrip(b"\0") == b"GNU":
            return buf[desc_at:desc_at + descsz].hex() or None
        pos = desc_at + ((descsz + 3) & ~3)
    return None


def _library(path: str) -> E.Library:
    try:
        st = os.stat(path)
        size, mtime, ino = st.st_size, st.st_mtime_ns, st.st_ino
    except OSError:
        size, mtime, ino = -1, 0, 0
    m = _NAME_VERSION.search(os.path.basename(path))
    return E.Library(path=path, size=size, mtime_ns=mtime, inode=ino, build_id=read_build_id(path),
                     version=m.group(1) if m else None, version_source="file name" if m else None)


def _module_version(name: str) -> Optional[str]:
    mod = sys.modules.get(name)
    v = getattr(mod, "__version__", None) if mod is not None else None
    return str(v) if v is not None else None


def collect_self(reason: str, host: Optional[str] = None,
                 previous: Optional[E.ProcessEnv] = None) -> E.ProcessEnv:
    """This process's facts now. Libraries already in ``previous`` (same path and inode)
    are reused, so a repeated record reads only new files. Raises OSError when
    /proc/self/maps cannot be read."""
    with open("/proc/self/maps", "r", errors="replace") as f:
        maps = parse_maps(f.read())
    known = {lb.path: lb for lb in previous.libraries} if previous else {}
    libs = []
    for path in E.unique(m.path for m in maps):
        if matters(path):
            lb = known.get(path)
            libs.append(lb if lb is not None else _library(path))
    return E.ProcessEnv(host=host or socket.gethostname(), pid=os.getpid(), python=sys.version.split()[0],
                        executable=sys.executable, torch=_module_version("torch"), ray=_module_version("ray"),
                        libraries=tuple(libs), environ=E.mask_environ(os.environ), mappings=tuple(maps),
                        wall_ns=time.time_ns(), reason=reason)


def write(run_dir: str, pe: E.ProcessEnv) -> str:
    """Write ``pe`` to ``RUN_DIR/env/<host>-<pid>.json`` atomically (mode 0600); returns
    the path. Raises OSError."""
    d = os.path.join(run_dir, E.ENV_DIR)
    os.makedirs(d, mode=0o700, exist_ok=True)
    path = E.env_path(run_dir, pe.host, pe.pid)
    tmp = "%s.tmp%d" % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, json.dumps(E.to_json(pe), separators=(",", ":")).encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return path


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
    return [dataclasses.replace(pe, rank=ranks.get((pe.host, pe.pid), -1)) for pe in envs]


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
        libs.append(dataclasses.replace(lb, build_id=bid, version=ver, version_source=src))
    return dataclasses.replace(pe, libraries=tuple(libs))


def _elftools_build_id(path: str) -> Optional[str]:
    """Build-id through pyelftools' note iterator (the slow, thorough reader)."""
    try:
        from elftools.elf.elffile import ELFFile
        with open(path, "rb") as f:
            for seg in ELFFile(f).iter_segments():
                if seg["p_type"] == "PT_NOTE":
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
        with open(path, "rb") as f:
            elf = ELFFile(f)
            vaddr = None
            for seg in elf.iter_segments():
                if seg["p_type"] == "PT_LOAD" and seg["p_offset"] <= file_offset < seg["p_offset"] + seg["p_filesz"]:
                    vaddr = file_offset - seg["p_offset"] + seg["p_vaddr"]
                    break
            if vaddr is None:
                return None
            for name in (".symtab", ".dynsym"):
                sec = elf.get_section_by_name(name)
                if sec is None:
                    continue
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
        from hangtrace.tracer.collect.rings import read_kernel_log as read_log
    lines, status = read_log()
    tag = "[%d]" % pid
    keep = [t for _, t in lines if tag in t and (" segfault at " in t or " trap " in t or "general protection" in t)]
    return "\n".join(keep), status


def run_env(path: str, enrich_local: bool = True) -> Tuple[List[E.ProcessEnv], List[str]]:
    """The env records of a run directory or stored snapshot (a snapshot without its own
    ``env/`` reads its run directory's), ranks joined from the ring headers and, with
    ``enrich_local``, pyelftools facts added for this host's libraries (:func:`enrich`).
    Returns ``(records, error lines)``; never raises for unreadable files."""
    from hangtrace.tracer.collect import rings
    env_root = path
    if rings.is_snapshot(path) and not os.path.isdir(os.path.join(path, E.ENV_DIR)):
        env_root = os.path.dirname(os.path.dirname(os.path.abspath(path)))
    envs, errors = load_env(env_root)
    ranks: Dict[Tuple[str, int], int] = {}
    try:
        snap = rings.load_snapshot(path) if rings.is_snapshot(path) else rings.load_run(path, live_facts=False)
        # the process model: only the process that IS rank r compares as rank r (helpers
        # that inherited RANK - resource trackers, DataLoader workers - do not)
        from hangtrace.tracer.process_model import assign_roles
        model = assign_roles(snap.processes)
        ranks = {(p.host, p.pid): (p.rank if model.ranks.get(p.rank) is p else -1) for p in snap.processes}
    except Exception as e:  # no ring: compare without ranks
        errors.append("ranks unknown (%s): processes are named by pid" % e)
    envs = with_ranks(envs, ranks)
    if enrich_local:
        envs = [enrich(pe) for pe in envs]
    return envs, errors


def crash_frame(run_dir: str, host: str, pid: int,
                read_log: Optional[Callable[[], Tuple[list, str]]] = None) -> Optional[str]:
    """Library and symbol of the native frame where process ``host:pid`` of ``run_dir``
    took its fatal signal (see ``analyze.envdiff.fatal_frame_library``), from its
    recorded mappings and this host's kernel log; None for another host, no record, no
    kernel line (SIGABRT, rate limit, exception-trace off) or an unreadable log."""
    from hangtrace.tracer.analyze.envdiff import fatal_frame_library
    if host != socket.gethostname():
        return None
    envs, _ = load_env(run_dir)
    maps = next((pe.mappings for pe in envs if pe.host == host and pe.pid == pid), ())
    text, status = kernel_fault_text(pid, read_log)
    if status != "read" or not text:
        return None
    return fatal_frame_library(text, maps, symbolize, pid=pid)


def verdict_evidence(run_dir: str, processes: Sequence, culprit_ranks: Sequence[int],
                     envs: Optional[List[E.ProcessEnv]] = None) -> List[str]:
    """The evidence lines issue 12 adds to a verdict, for the one call site after
    ``diagnose``: the culprits' environment differences (``envdiff_evidence``) and, for a
    culprit that died with a fatal-signal dump, the crashing native frame
    ("rank 1 died in libX.so, sym+0x9 (segfault; path +0xOFF)"). ``processes``: the
    snapshot's ProcessInfo list (host, pid, rank, state, signals); ``envs``: the records
    when the caller read them already (``run_env``). Never raises."""
    from hangtrace.tracer.analyze.envdiff import envdiff_evidence
    out: List[str] = []
    try:
        if envs is None:
            envs, _ = run_env(run_dir, enrich_local=False)
        out += envdiff_evidence(envs, culprit_ranks)
        for p in processes:
            if p.rank in culprit_ranks and p.state != "alive" and "fatal" in (p.signals or {}):
                frame = crash_frame(run_dir, p.host, p.pid)
                if frame:
                    out.append("rank %d died in %s" % (p.rank, frame))
    except Exception:
        pass
    return out
