"""Flight Recorder data types: torch's dump of one rank, typed and frozen. Data only.

In: nothing (``collect/frdump.py`` parses dump files into these). Out: ``FrDump`` (one
rank's dump: ``pg_config`` groups, ``pg_status`` counters, ``FrEntry`` launches with their
``FrFrame`` stacks), read by ``ring/frrecords.py`` and ``ring/frjoin.py``, which turn them
into our record dicts and processes. Format: torch's ``FlightRecorder.hpp`` (torch 2.13).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, NamedTuple, Optional, Tuple


class FrFrame(NamedTuple):
    """One Python/C++ frame of an entry's stack (innermost first, as torch stores it)."""

    name: str
    filename: str
    line: int


class FrGroup(NamedTuple):
    """A process group from ``pg_config``: ``ranks`` global, None when not given (gloo)."""

    name: str
    desc: str
    ranks: Optional[Tuple[int, ...]]


class FrPgStatus(NamedTuple):
    """``pg_status`` of one process group (torch's collective sequence ids, -1 = none)."""

    last_enqueued: int
    last_started: int
    last_completed: int


@dataclass(frozen=True)
class FrEntry:
    """One Flight Recorder entry: one collective or p2p launch on a process group.

    ``op`` is ``profiling_name`` without its backend prefix (``backend``); for p2p names
    like ``send 1->2`` / ``recv 3<-0``, ``op`` is ``send``/``recv``, ``self_local`` the
    issuing rank and ``peer_local`` the other one (group-local ranks). Sizes are element
    counts per dimension, one tuple per tensor; dtypes torch's scalar names (``Float``).
    Times are ns since the Unix epoch; discovery times None when unknown (0 in JSON).
    ``state`` is torch's (``scheduled``|``started``|``completed``); gloo entries stay
    ``scheduled`` and get ``retired`` when the work finishes (torch 2.13, checked here).
    """

    record_id: int
    pg_id: int
    group: str
    group_desc: str
    collective_seq_id: int
    p2p_seq_id: int
    op_id: int
    profiling_name: str
    backend: str
    op: str
    self_local: Optional[int]
    peer_local: Optional[int]
    is_p2p: bool
    input_sizes: Tuple[Tuple[int, ...], ...]
    input_dtypes: Tuple[str, ...]
    output_sizes: Tuple[Tuple[int, ...], ...]
    output_dtypes: Tuple[str, ...]
    state: str
    retired: bool
    timeout_ms: int
    time_created_ns: int
    time_discovered_started_ns: Optional[int]
    time_discovered_completed_ns: Optional[int]
    duration_ms: Optional[float]
    thread_name: str
    thread_id: str
    frames: Tuple[FrFrame, ...]


@dataclass(frozen=True)
class FrDump:
    """One rank's dump. ``rank`` is global (-1 unknown); ``pid`` 0 when unknown.

    ``entries_from_ns`` not None: ``entries`` are only those a join with the process's ring
    window can use (``collect/frentryparse.select_raw``: launched at or after that wall time
    (ns), plus the newest and highest-numbered ones before it and the failed ones)."""

    path: str
    rank: int
    version: str
    comm_lib_version: str
    pg_config: Dict[str, FrGroup]
    pg_status: Dict[int, FrPgStatus]
    entries: Tuple[FrEntry, ...]
    host: str = ""
    pid: int = 0
    world_size: int = -1
    written_wall_ns: int = 0
    entries_from_ns: Optional[int] = None
