"""Read torch Flight Recorder dumps (issue 10, item 3): files in, typed ``FrDump`` out.

Impure: ``find_fr_files``, ``read_fr_file``, ``load_fr_dir``. Pure:
``parse_fr_bytes`` (its entries: ``collect/frentryparse.py``, each distinct shape parsed
once). Types: ``ring/frentries.py``. Format: torch's ``FlightRecorder.hpp``, checked on
torch 2.13 CPU.

Files recognised in a directory:

* ``comm_lib_trace_rank_<r>`` and the older ``nccl_trace_rank_<r>``: torch's own names
  (``TORCH_FR_DUMP_TEMP_FILE`` + global rank). The rank comes from the name (torch's
  ``flight_recorder/components/loader.py`` does the same: the dump holds no global rank).
* ``<host>-<pid>.pkl`` / ``.json`` written by our agent (``hooks/torchdist/fr_agent.py``) under
  ``RUN_DIR/fr/``, each with a sidecar ``<host>-<pid>.meta.json`` giving rank, world size,
  host and pid.

Pickles are read through ``_SafeUnpickler``: the only globals admitted are
``torch.jit._pickle.build_{int,double,bool,tensor}list`` (mapped to ``list``); anything
else (``os.system``, ``builtins.eval`` ...) raises ``UnsafePickleError`` naming the file,
before any of it is called. Versions ``2.x`` are read (unknown keys ignored); a bare list
(pre-2024 dumps) is read as the entries; any other major version raises
``UnsupportedFrVersionError``.
"""

from __future__ import annotations

import glob
import io
import json
import os
import pickle
import re
from typing import Any, Callable, Dict, List, Optional, Tuple

from hangtrace.tracer.errors import HangtraceError
from hangtrace.tracer.collect.frentryparse import as_int, parse_entries, select_raw
from hangtrace.tracer.collect.frentryparse import split_profiling_name as split_profiling_name
from hangtrace.tracer.ring.frentries import FrDump, FrGroup, FrPgStatus

TORCH_NAME_RE = re.compile(r"^(?:comm_lib_trace_rank_|nccl_trace_rank_)(\d+)$")
AGENT_NAME_RE = re.compile(r"^(.+)-(\d+)\.(pkl|json)$")
#: backends seen in ``profiling_name`` prefixes (torch 2.13 sources and hook backends)
BACKEND_PREFIXES = ("nccl", "gloo", "ncclx", "xccl", "nccl2", "ucc", "mpi", "custom")
_LIST_BUILDERS = {"build_intlist", "build_doublelist", "build_boollist", "build_tensorlist"}
MAX_FILE_BYTES = 1 << 30


class FlightRecordError(HangtraceError):
    """A Flight Recorder dump that cannot be read: names the file and the problem."""

    exit_code = 3
    remedy = (
        "remove the file to analyse the other ranks, or dump it again "
        "(torch._C._distributed_c10d._dump_fr_trace)"
    )

    def __init__(self, path: str, problem: str, remedy: Optional[str] = None) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__("%s: %s" % (path, problem), remedy)


class UnsafePickleError(FlightRecordError):
    remedy = (
        "the pickle asks to import code a Flight Recorder dump never contains; it was not "
        "written by torch's Flight Recorder and was not executed. Remove it, or ask its "
        "author for a JSON dump (_dump_fr_trace_json)"
    )


class UnsupportedFrVersionError(FlightRecordError):
    remedy = (
        "hangtrace reads Flight Recorder dumps of version 2.x; read this one with the torch "
        "version that wrote it (python -m torch.distributed.flight_recorder.fr_trace), or "
        "upgrade hangtrace"
    )


class _SafeUnpickler(pickle.Unpickler):
    """Admits only torch's list-building helpers; refuses every other global."""

    def __init__(self, data: bytes, path: str) -> None:
        # buffered: the C unpickler then peeks ahead instead of calling read() per opcode
        # (torch's protocol-2 pickles have no frames): 2-3 times faster (issue 40)
        super().__init__(io.BufferedReader(io.BytesIO(data), 1 << 16))
        self._path = path

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch.jit._pickle" and name in _LIST_BUILDERS:
            return list
        raise UnsafePickleError(
            self._path,
            "pickle refers to %s.%s, which a Flight Recorder dump never "
            "contains; refused (nothing was executed)" % (module, name),
        )

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickleError(self._path, "pickle uses persistent ids; refused")


def _ranks(v: Any) -> Optional[Tuple[int, ...]]:
    """``ranks`` of a pg_config item: a string like ``"[0, 1]"`` (torch) or a list."""
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except ValueError:
            return None
    if isinstance(v, (list, tuple)) and v:
        try:
            return tuple(int(x) for x in v)
        except (TypeError, ValueError):
            return None
    return None


def _decode(data: bytes, path: str) -> Any:
    if data[:1] == b"\x80":
        try:
            return _SafeUnpickler(data, path).load()
        except FlightRecordError:
            raise
        except (
            pickle.UnpicklingError,
            EOFError,
            ValueError,
            TypeError,
            IndexError,
            KeyError,
            AttributeError,
            MemoryError,
        ) as e:
            raise FlightRecordError(path, "truncated or corrupt pickle (%s: %s)" % (type(e).__name__, e))
    head = data.lstrip()[:1]
    if head in (b"{", b"["):
        try:
            return json.loads(data)
        except ValueError as e:
            raise FlightRecordError(path, "truncated or corrupt JSON (%s)" % e)
    raise FlightRecordError(
        path,
        "not a Flight Recorder dump (neither a pickle nor JSON)",
        "remove the file from the directory, or pass the directory holding the dumps",
    )


def parse_fr_bytes(
    data: bytes,
    path: str,
    rank: int = -1,
    host: str = "",
    pid: int = 0,
    world_size: int = -1,
    written_wall_ns: int = 0,
    cutoff_ns: Optional[int] = None,
) -> FrDump:
    """Parse one dump (pickle or JSON bytes) into a ``FrDump``. Pure. ``cutoff_ns``: parse
    only the entries a join with a ring window starting then can use (``select_raw``).

    Raises ``UnsafePickleError`` (a global other than torch's list builders),
    ``UnsupportedFrVersionError`` (version not 2.x), ``FlightRecordError`` (truncated,
    corrupt or foreign data); each names ``path``.
    """
    obj = _decode(data, path)
    if isinstance(obj, list):  # pre-2024: a bare list of entries
        obj = {"version": "1.0-bare-list", "entries": obj}
    if not isinstance(obj, dict):
        raise FlightRecordError(path, "expected a dict or a list at top level, got %s" % type(obj).__name__)
    version = str(obj.get("version", ""))
    if version != "1.0-bare-list":
        major = version.split(".")[0]
        if major != "2":
            raise UnsupportedFrVersionError(
                path, "Flight Recorder dump version %r is not supported" % (version or "(none)")
            )
    raw_entries = obj.get("entries") or []
    if not isinstance(raw_entries, list):
        raise FlightRecordError(path, "'entries' is not a list")
    if cutoff_ns is not None:
        raw_entries = select_raw(raw_entries, cutoff_ns)
    entries = parse_entries(raw_entries)
    cfg: Dict[str, FrGroup] = {}
    for key, g in (obj.get("pg_config") or {}).items():
        if isinstance(g, dict) and (g.get("name") or key):
            cfg[str(g.get("name") or key)] = FrGroup(
                str(g.get("name") or key), str(g.get("desc") or ""), _ranks(g.get("ranks"))
            )
    status: Dict[int, FrPgStatus] = {}
    for key, s in (obj.get("pg_status") or {}).items():
        if isinstance(s, dict):
            status[as_int(key, -1)] = FrPgStatus(
                as_int(s.get("last_enqueued_collective"), -1),
                as_int(s.get("last_started_collective"), -1),
                as_int(s.get("last_completed_collective"), -1),
            )
    lib = obj.get("comm_lib_version", obj.get("nccl_version", ""))
    return FrDump(
        path=path,
        rank=rank,
        version=version,
        comm_lib_version=str(lib or ""),
        pg_config=cfg,
        pg_status=status,
        entries=entries,
        host=host,
        pid=pid,
        world_size=world_size,
        written_wall_ns=written_wall_ns,
        entries_from_ns=cutoff_ns,
    )


def find_fr_files(directory: str) -> List[str]:
    """Paths of Flight Recorder dumps in ``directory`` and in ``directory/fr`` (sorted)."""
    out = []
    for d in (directory, os.path.join(directory, "fr")):
        for p in sorted(glob.glob(os.path.join(d, "*"))):
            b = os.path.basename(p)
            if not os.path.isfile(p) or b.endswith(".meta.json") or b.endswith(".tmp"):
                continue
            if TORCH_NAME_RE.match(b) or (d.endswith("fr") and AGENT_NAME_RE.match(b)):
                out.append(p)
    return out


#: (host, pid, rank) of a dump -> the wall time (ns) its entries are needed from, or None: all
CutoffFor = Callable[[str, int, int], Optional[int]]


def read_fr_file(path: str, cutoff_for: Optional[CutoffFor] = None) -> FrDump:
    """Read one dump file. Identity: rank from a torch file name, else from our sidecar
    ``<host>-<pid>.meta.json``. ``cutoff_for``: which of its entries to parse
    (``parse_fr_bytes``' ``cutoff_ns``), by its identity. Raises ``FlightRecordError`` (and
    subclasses), naming it."""
    try:
        st = os.stat(path)
        if st.st_size > MAX_FILE_BYTES:
            raise FlightRecordError(
                path, "file of %d bytes is larger than any Flight Recorder dump" % st.st_size
            )
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise FlightRecordError(path, "unreadable (%s)" % e, "check the file's permissions")
    if not data:
        raise FlightRecordError(path, "empty file (the dump was interrupted)")
    base = os.path.basename(path)
    rank, host, pid, world = -1, "", 0, -1
    m = TORCH_NAME_RE.match(base)
    if m:
        rank = int(m.group(1))
    else:
        m = AGENT_NAME_RE.match(base)
        if m:
            host, pid = m.group(1), int(m.group(2))
            try:
                with open(os.path.join(os.path.dirname(path), "%s-%d.meta.json" % (host, pid)), "rb") as f:
                    meta = json.loads(f.read())
                rank, world = as_int(meta.get("rank"), -1), as_int(meta.get("world_size"), -1)
            except (OSError, ValueError, AttributeError):
                pass
    return parse_fr_bytes(
        data,
        path,
        rank=rank,
        host=host,
        pid=pid,
        world_size=world,
        written_wall_ns=st.st_mtime_ns,
        cutoff_ns=cutoff_for(host, pid, rank) if cutoff_for is not None else None,
    )


def load_fr_dir(
    directory: str, errors: Optional[List[str]] = None, cutoff_for: Optional[CutoffFor] = None
) -> List[FrDump]:
    """Every readable dump of ``directory`` (see ``find_fr_files``), ordered by rank
    (``cutoff_for``: see ``read_fr_file``).

    A file that cannot be read adds one line (problem and remedy) to ``errors`` and the
    other files are still read. Never raises for a bad file.
    """
    dumps = []
    for p in find_fr_files(directory):
        try:
            dumps.append(read_fr_file(p, cutoff_for))
        except FlightRecordError as e:
            if errors is not None:
                errors.append("%s (remedy: %s)" % (e, e.remedy))
    dumps.sort(key=lambda d: (d.rank < 0, d.rank, d.path))
    return dumps
