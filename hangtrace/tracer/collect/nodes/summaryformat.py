"""A node's snapshot as a compact, versioned node summary, and back (issue 39).

A node summary is what one node sends the assembler instead of its rings: zlib-compressed
JSON (orjson) of ``{"format": FORMAT, "version": VERSION, "node": {...}, "incident": n,
"processes": [...], "envs": [...], "errors": [...]}``. Per traced process: its identity and
state, phase/step, last progress, the records the analysis reads (``RingSummary.records()``:
newest per group and per peer - the frontier seqs -, the blocked op and its peer, first
failure, last record and progress) plus the newest :data:`TAIL` records (each rank's own
history), its groups, events (deaths and their causes), signal stacks cut to
:data:`SIGNAL_TEXT` bytes, its stack threads cut to :data:`FRAMES` innermost frames, and its
environment record without the memory mappings (the env-facts digest). Measured a few
kilobytes per rank compressed (benchmarks/bench_multinode.py).

:func:`encode` (a Snapshot of this node -> bytes), :func:`decode` (bytes -> :class:`NodePart`,
raises :class:`SummaryError` naming what is wrong: not ours, another version, garbage).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import orjson

from hangtrace.tracer.ring.summary import in_stream_order, record_key, summarize_records
from hangtrace.tracer.snapshot import ProcessInfo, Role, Snapshot

FORMAT = "hangtrace-node-summary"
VERSION = 1
#: newest records kept per process beside the summary's own (its history)
TAIL = 64
#: innermost frames kept per thread
FRAMES = 40
#: bytes of each faulthandler text kept
SIGNAL_TEXT = 8192
#: newest memory samples and events kept per process
MEMORY = 16
EVENTS = 48

_SCALARS = (
    "host",
    "pid",
    "rank",
    "local_rank",
    "world_size",
    "run_id",
    "state",
    "exit_code",
    "exit_wall_ns",
    "start_wall_ns",
    "phase",
    "step",
    "progress_wall_ns",
    "progress_mono_ns",
    "inflight",
    "groups",
    "meta",
    "stack_source",
    "stack_error",
    "warnings",
    "memory_facts",
)


class SummaryError(ValueError):
    """A node summary that cannot be used; the message names why."""


@dataclass(frozen=True)
class NodePart:
    """One node's summary decoded: ``node`` (node_rank, node_count, host, run_dir, job),
    ``incident`` it answers, its processes (``meta['node_rank']`` set), environment
    records (JSON dicts, schema of ``tracer/envfacts.py``), error lines, size in bytes."""

    node: Dict[str, Any]
    incident: int
    processes: Tuple[ProcessInfo, ...]
    envs: Tuple[Dict[str, Any], ...] = ()
    errors: Tuple[str, ...] = ()
    taken_wall_ns: int = 0
    nbytes: int = 0
    reason: str = ""

    @property
    def node_rank(self) -> int:
        return int(self.node.get("node_rank", -1))


def _records(p: ProcessInfo) -> Tuple[List[Any], int]:
    s = p.summary
    if s is None:
        return list(p.records), 0
    memory = set(id(r) for r in s.memory[:-MEMORY]) if len(s.memory) > MEMORY else set()
    keep: Dict[Any, Any] = {}
    for r in list(s.records()) + list(s.tail[-TAIL:]):
        if id(r) not in memory:
            keep.setdefault(record_key(r), dict(r))
    inflight = s.inflight.get("idx", 0) if s.inflight is not None else 0
    return in_stream_order(keep.values()), int(inflight or 0)


def _stacks(threads: Optional[Sequence[Mapping[str, Any]]]) -> Optional[List[Dict[str, Any]]]:
    if threads is None:
        return None
    return [dict(t, frames=list(t.get("frames") or ())[:FRAMES]) for t in threads]


def process_dict(p: ProcessInfo) -> Dict[str, Any]:
    """One process of a node summary (see the module docstring)."""
    d = {k: getattr(p, k) for k in _SCALARS}
    d["records"], d["inflight_idx"] = _records(p)
    d["events"] = list(p.events or ())[-EVENTS:]
    d["signals"] = {
        k: dict({kk: vv for kk, vv in v.items() if kk != "text"}, text=str(v.get("text", ""))[-SIGNAL_TEXT:])
        for k, v in (p.signals or {}).items()
    }
    d["stacks"] = _stacks(p.stacks)
    d["children"] = list(p.children)
    d["memory"] = list(p.memory)[-MEMORY:]
    d["role"] = p.role.value if p.role is not None else None
    return d


def encode(
    snap: Snapshot, node: Mapping[str, Any], incident: int, envs: Sequence[Mapping[str, Any]] = ()
) -> bytes:
    """The node summary of ``snap`` (this node's snapshot) for ``incident``; ``node``:
    node_rank, node_count, host, run_dir, job. Bytes (zlib of JSON)."""
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "node": dict(node),
        "incident": incident,
        "reason": snap.reason,
        "taken_wall_ns": snap.taken_wall_ns,
        "errors": list(snap.errors),
        "processes": [process_dict(p) for p in snap.processes],
        "envs": [{k: v for k, v in e.items() if k != "mappings"} for e in envs],
    }
    return zlib.compress(orjson.dumps(doc, default=str), 6)


def process_of(d: Mapping[str, Any], node_rank: int) -> ProcessInfo:
    """The ProcessInfo of one process dict of a summary (``meta['node_rank']`` set).
    Raises KeyError/TypeError/ValueError when it is malformed."""
    records = list(d.get("records") or ())
    kw: Dict[str, Any] = {k: d[k] for k in _SCALARS if k in d}
    kw["meta"] = dict(kw.get("meta") or {}, node_rank=node_rank)
    kw["pid"] = int(kw["pid"])
    kw["host"] = str(kw["host"])
    role = d.get("role")
    return ProcessInfo(
        **kw,
        records=records,
        summary=summarize_records(records, int(d.get("inflight_idx") or 0)),
        events=list(d.get("events") or ()),
        signals=dict(d.get("signals") or {}),
        stacks=d.get("stacks"),
        children=tuple(d.get("children") or ()),
        memory=list(d.get("memory") or ()),
        role=Role(role) if role else None,
    )


def decode(data: bytes) -> NodePart:
    """A node summary's bytes as a :class:`NodePart`. Raises SummaryError: not zlib/JSON
    (garbage), not ours (``format``), another ``version``, or malformed processes."""
    try:
        doc = orjson.loads(zlib.decompress(data))
    except (zlib.error, orjson.JSONDecodeError, TypeError) as e:
        raise SummaryError("not a node summary (%d bytes of garbage: %s)" % (len(data), e)) from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise SummaryError(
            "not a hangtrace node summary (format %r)"
            % (doc.get("format") if isinstance(doc, dict) else type(doc).__name__)
        )
    if doc.get("version") != VERSION:
        raise SummaryError(
            "node summary of version %r, this hangtrace reads version %d (run one hangtrace "
            "version on every node)" % (doc.get("version"), VERSION)
        )
    node = doc.get("node")
    if not isinstance(node, dict):
        raise SummaryError("node summary without its node")
    try:
        nr = int(node.get("node_rank", -1))
        procs = tuple(process_of(p, nr) for p in doc.get("processes") or ())
        return NodePart(
            node=node,
            incident=int(doc.get("incident", -1)),
            processes=procs,
            envs=tuple(e for e in doc.get("envs") or () if isinstance(e, dict)),
            errors=tuple(str(e) for e in doc.get("errors") or ()),
            taken_wall_ns=int(doc.get("taken_wall_ns") or 0),
            nbytes=len(data),
            reason=str(doc.get("reason", "")),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise SummaryError("malformed node summary: %r" % (e,)) from None


def node_envs(run_dir: str, processes: Sequence[ProcessInfo]) -> List[Dict[str, Any]]:
    """The environment records (JSON) of ``processes`` read from ``run_dir/env``; [] for
    those without one. Never raises."""
    import os

    out = []
    for p in processes:
        path = os.path.join(run_dir, "env", "%s-%d.json" % (p.host, p.pid))
        try:
            with open(path, "rb") as f:
                d = orjson.loads(f.read())
            if isinstance(d, dict):
                out.append(d)
        except (OSError, ValueError):
            continue
    return out


__all__ = ["encode", "decode", "NodePart", "SummaryError"]
