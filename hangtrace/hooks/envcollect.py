"""The in-process half of issue 12's environment record: what this traced process is
running - the executable file mappings (for naming a crashing frame after death), the
libraries that matter with their GNU build-id (a few ``struct`` reads of the ELF program
headers; pyelftools is *not* used here: importing it alone costs more than the whole
record, ``benchmarks/bench_forensics.py``), versions and the masked job environment -
written to ``RUN_DIR/env/<host>-<pid>.json`` (contract: ``tracer/envfacts.py``).

Called by ``hooks/envrecord.py``; standard library only, imported in traced processes.
The out-of-process half (reading, enriching with pyelftools, differences) is
``tracer/collect/forensics.py``.
"""
import json
import os
import re
import struct
import sys
import time
from typing import List, Optional

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
    return E.ProcessEnv(host=host or os.uname().nodename, pid=os.getpid(), python=sys.version.split()[0],
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
