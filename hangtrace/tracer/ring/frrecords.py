"""Flight Recorder entries as our records, and joined with our ring records. Pure.

In: ``ring/frentries.py`` types (a parsed dump) and our ring record dicts. Out: record
dicts. ``fr_records(dump)`` turns each ``FrEntry`` into a record dict of the shape
``snapshot.ProcessInfo.records`` has (``tracer.ring.records.decode_slots``), with
``source='flight-recorder'`` (``FR_SOURCE``). ``merge_records(ours, fr)`` joins both
streams of one process (``FR_JOINED_SOURCE``); ``ring/frjoin.py`` builds processes from them.

How the two numberings align (checked on torch 2.13 gloo, tests/integration/test_fr_live.py):
both name a group by torch's process-group name (``_get_process_group_name``: ``'0'`` for the
default group, ``'1'``, ... for new groups; FR's ``process_group[0]``), and both count
collectives per group from 1, one per launch. A world ``all_reduce`` loop gets 1, 2, 3 ... in
both. They part where a Python call launches more or fewer than one collective: torch counts
every launch (DDP's C++ gradient all-reduce, FSDP, functional collectives, the two
``all_gather``s of ``all_gather_object``), our wrappers count Python calls. So torch's number
is the one all ranks agree on: a joined event takes FR's ``collective_seq_id``, and our
record is paired with the FR entry of its group created inside its call (FR's
``time_created_ns`` between our record's issue and completion wall times), preferring the
same op. gloo records no p2p in the Flight Recorder (torch 2.13): p2p records stay ours.

State (torch 2.13, checked here): gloo entries stay ``scheduled`` and are marked
``retired`` when the work finishes, so on gloo retired = 'completed', not retired =
'issued'. Other backends update ``state``: 'completed' -> 'completed'; retired without
completing (timed out, aborted) -> 'failed'; else 'issued'.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Set, Tuple

from hangtrace.tracer.ring.frcands import Cands
from hangtrace.tracer.ring.frentries import FrDump, FrEntry

#: ``source`` of a record from torch's Flight Recorder alone, and of our record joined with
#: its Flight Recorder entry (``ring/frrecords.py``); our ring records have none.
FR_SOURCE = "flight-recorder"
FR_JOINED_SOURCE = "hangtrace+flight-recorder"

#: torch scalar-type names (FR ``input_dtypes``) -> our dtype names (ring layout DTYPES)
DTYPE_NAMES = {
    "Float": "float32",
    "Double": "float64",
    "Half": "float16",
    "BFloat16": "bfloat16",
    "Byte": "uint8",
    "Char": "int8",
    "Short": "int16",
    "Int": "int32",
    "Long": "int64",
    "Bool": "bool",
    "ComplexFloat": "complex64",
    "ComplexDouble": "complex128",
    "Float8_e4m3fn": "float8_e4m3fn",
    "Float8_e5m2": "float8_e5m2",
    "UInt16": "uint16",
    "UInt32": "uint32",
    "UInt64": "uint64",
}
#: our op -> FR ops its Python call launches (beyond the same name)
OP_ALIASES = {
    "all_gather_into_tensor": ("_allgather_base", "allgather_into_tensor_coalesced"),
    "reduce_scatter_tensor": ("_reduce_scatter_base", "reduce_scatter_tensor_coalesced"),
    "all_gather_object": ("all_gather",),
    "broadcast_object_list": ("broadcast",),
    "gather_object": ("gather", "all_gather"),
    "scatter_object_list": ("scatter", "broadcast"),
    "monitored_barrier": ("barrier",),
    "all_to_all_single": ("alltoall_base",),
    "all_to_all": ("alltoall",),
    # torch 2.13: all_gather_into_tensor / reduce_scatter_tensor call these two
    "all_gather_single": ("_allgather_base", "allgather_into_tensor_coalesced"),
    "reduce_scatter_single": ("_reduce_scatter_base", "reduce_scatter_tensor_coalesced"),
}
SLACK_NS = 200_000  # both sides read CLOCK_REALTIME around one call: 0.2 ms of tolerance


def fr_state(e: FrEntry) -> str:
    """'completed' | 'issued' | 'failed' of an entry (rules in the module docstring)."""
    if e.state == "completed":
        return "completed"
    if e.backend == "gloo":
        return "completed" if e.retired else "issued"
    return "failed" if e.retired else "issued"


def _global(ranks: Optional[Tuple[int, ...]], local: Optional[int], group: str, desc: str) -> int:
    if local is None:
        return -1
    if ranks:
        return ranks[local] if 0 <= local < len(ranks) else -1
    if group == "0" or desc == "default_pg":
        return local
    return -1


def fr_record(
    e: FrEntry, dump: Optional[FrDump] = None, frames: Optional[Dict[int, List[Dict[str, Any]]]] = None
) -> Dict[str, Any]:
    """One entry as a record dict (``snapshot`` module docstring keys, plus ``fr_*``).
    ``frames``: a cache of the ``frames`` lists by their FrFrame tuple's id (the entries of
    one dump share their stacks' tuples, ``collect/frdump.py``): the records then share the
    list too; readers must not modify it."""
    sizes = e.input_sizes or e.output_sizes
    numel = 0
    for s in sizes:
        n = 1
        for d in s:
            n *= d
        numel += n
    dts = e.input_dtypes or e.output_dtypes
    g = dump.pg_config.get(e.group) if dump is not None else None
    state = fr_state(e)
    p2p = e.is_p2p or e.peer_local is not None
    return {
        "idx": e.record_id + 1,
        "kind": "p2p" if p2p else "collective",
        "op": e.op,
        "group": e.group,
        "seq": e.p2p_seq_id if p2p else e.collective_seq_id,
        "dtype": DTYPE_NAMES.get(dts[0], dts[0].lower()) if dts else "",
        "numel": numel,
        "shape": "x".join(str(d) for d in sizes[0]) or "scalar" if sizes else None,
        "peer": _global(g.ranks if g else None, e.peer_local, e.group, e.group_desc),
        "async_op": False,
        "thread": e.thread_name or None,
        "phase": None,
        "step": None,
        "t_mono_ns": 0,
        "t_wall_ns": e.time_created_ns,
        "t_end_mono_ns": None,
        "state": state,
        "error": (
            "flight recorder: retired before completion (timed out or aborted; timeout %d ms)" % e.timeout_ms
        )
        if state == "failed"
        else None,
        "source": FR_SOURCE,
        "fr_op": e.profiling_name,
        "fr_state": e.state,
        "fr_retired": e.retired,
        "fr_record_id": e.record_id,
        "fr_seq": e.collective_seq_id,
        "fr_p2p_seq": e.p2p_seq_id,
        "fr_timeout_ms": e.timeout_ms,
        "fr_thread_id": e.thread_id,
        "group_desc": e.group_desc,
        "fr_started_ns": e.time_discovered_started_ns,
        "fr_completed_ns": e.time_discovered_completed_ns,
        "fr_duration_ms": e.duration_ms,
        "frames": _frame_dicts(e.frames, frames),
    }


def _frame_dicts(
    fs: Tuple[Any, ...], cache: Optional[Dict[int, List[Dict[str, Any]]]]
) -> List[Dict[str, Any]]:
    got = cache.get(id(fs)) if cache is not None else None
    if got is None:
        got = [{"name": f.name, "filename": f.filename, "line": f.line} for f in fs]
        if cache is not None:
            cache[id(fs)] = got
    return got


def _shape(e: FrEntry) -> Tuple[Any, ...]:
    """What ``fr_record`` reads of ``e`` besides its ids, seq numbers and times; its tuples
    by identity (the entries of one shape share them: ``collect/frdump.py``), so valid only
    while the entries compared are alive."""
    return (
        id(e.input_sizes),
        id(e.output_sizes),
        id(e.input_dtypes),
        id(e.output_dtypes),
        id(e.frames),
        e.profiling_name,
        e.op,
        e.backend,
        e.group,
        e.group_desc,
        e.state,
        e.retired,
        e.timeout_ms,
        e.thread_name,
        e.thread_id,
        e.is_p2p,
        e.peer_local,
    )


def fr_records(dump: FrDump) -> List[Dict[str, Any]]:
    """Every entry of ``dump`` as a record dict, in launch order (``record_id``). Entries of
    one shape (``_shape``) are converted once: the others copy that record and set their
    own ids, seq numbers and times (issue 40)."""
    frames: Dict[int, List[Dict[str, Any]]] = {}
    done: Dict[Tuple[Any, ...], Dict[str, Any]] = {}
    out = []
    for e in sorted(dump.entries, key=lambda e: e.record_id):
        k = _shape(e)
        t = done.get(k)
        if t is None:
            t = done[k] = fr_record(e, dump, frames)
            out.append(t)
            continue
        r = dict(t)
        r["idx"] = e.record_id + 1
        r["seq"] = e.p2p_seq_id if r["kind"] == "p2p" else e.collective_seq_id
        r["t_wall_ns"] = e.time_created_ns
        r["fr_record_id"] = e.record_id
        r["fr_seq"] = e.collective_seq_id
        r["fr_p2p_seq"] = e.p2p_seq_id
        r["fr_started_ns"] = e.time_discovered_started_ns
        r["fr_completed_ns"] = e.time_discovered_completed_ns
        r["fr_duration_ms"] = e.duration_ms
        out.append(r)
    return out


def _end_wall(r: Dict[str, Any]) -> float:
    """Wall time (ns) our call returned; +inf while it is still 'issued'."""
    w = float(r.get("t_wall_ns") or 0)
    end, start = r.get("t_end_mono_ns"), r.get("t_mono_ns")
    if end and start and end >= start:
        return w + float(end - start)
    return float("inf") if r.get("state") == "issued" else w


def _compatible(ours: str, fr_op: str) -> bool:
    return ours == fr_op or fr_op in OP_ALIASES.get(ours, ())


def merge_records(
    ours: List[Dict[str, Any]], fr: List[Dict[str, Any]], since_ns: Optional[float] = None
) -> List[Dict[str, Any]]:
    """One record stream of a process from our ring records and its FR records.

    ``since_ns``: when ``ours`` is a window (the ring summary's records and its newest
    records, issue 40) rather than every record, the wall time (ns) the window of newest
    records starts at: FR entries launched before it pair with our records as always, but
    unpaired ones are kept only when they are their group's newest or failed (the ones a
    summary selects); the others belong with our records left out of the window.

    Collectives of a group FR saw: our record paired with the FR entry of that group created
    within its call (module docstring) becomes one event: our dict with ``seq`` = FR's,
    ``seq_ours`` = ours, FR's state when ours is still 'issued' (the ring lags the Work),
    the ``fr_*`` fields and ``source='hangtrace+flight-recorder'``. Further FR entries of the
    same call are kept with ``within_op`` = our op. FR-only entries (C++-issued) are kept
    as they are. Our unpaired collectives of such a group are numbered after the FR launch
    before them (``seq_ours`` keeps ours): torch's seq there, or, past the end of torch's
    dump, one more per call. Other records (p2p when FR has none on that group,
    phases, steps, events) pass unchanged. Result ordered by wall time (ties: ours first).
    """
    fr_coll: Dict[str, List[Dict[str, Any]]] = {}
    fr_p2p: List[Dict[str, Any]] = []
    for r in fr:
        if r["kind"] == "collective":
            fr_coll.setdefault(r["group"], []).append(r)
        else:
            fr_p2p.append(r)
    used: Set[int] = set()
    after: Dict[Tuple[str, int], int] = {}
    out: List[Dict[str, Any]] = []
    ours_p2p_groups = set()
    index = {g: Cands(c) for g, c in fr_coll.items()}
    layouts: Dict[Tuple[str, ...], Tuple[str, ...]] = {}
    for r in ours:
        kind = r.get("kind")
        if kind == "collective" and index:
            ix = index.get(str(r.get("group")))
            if ix is not None:
                out.extend(_merge_one(r, ix, used, after, layouts))
                continue
        elif kind == "p2p":
            ours_p2p_groups.add(r.get("group"))
        out.append(r)
    for g, cands in fr_coll.items():
        last = cands[-1]
        out.extend(e for e in cands if id(e) not in used and _in_window(e, since_ns, e is last))
    if fr_p2p:
        newest_p2p: Dict[Any, Dict[str, Any]] = {}
        for r in fr_p2p:
            newest_p2p[(r["group"], r.get("peer"))] = r
        for r in fr_p2p:
            if r["group"] not in ours_p2p_groups:
                if _in_window(r, since_ns, newest_p2p.get((r["group"], r.get("peer"))) is r):
                    out.append(r)
    # by wall time, ours first on ties (a stable sort on (time, from torch alone))
    fr_only = [r.get("source") == FR_SOURCE for r in out]
    keys = [(r.get("t_wall_ns") or 0, f) for r, f in zip(out, fr_only)]
    order = sorted(range(len(out)), key=keys.__getitem__)
    return _with_phase([out[i] for i in order], [fr_only[i] for i in order])


def _in_window(e: Dict[str, Any], since_ns: Optional[float], newest: bool) -> bool:
    """Whether unpaired FR record ``e`` stays in a merged window starting at ``since_ns``
    (None: every record is kept): launched in it, its group's (peer's) newest, or failed."""
    return since_ns is None or newest or e["t_wall_ns"] >= since_ns or e.get("state") == "failed"


def _merge_one(
    r: Dict[str, Any],
    cands: Cands,
    used: Set[int],
    after: Dict[Tuple[str, int], int],
    layouts: Dict[Tuple[str, ...], Tuple[str, ...]],
) -> List[Dict[str, Any]]:
    """Our collective ``r`` against its group's FR collectives ``cands`` (``used``: ids of those
    already paired, updated; ``after``: (group, torch's last seq) -> our calls numbered past
    the end of torch's dump so far, updated; ``layouts``: see ``_join_into``): the records it
    becomes (further FR launches of its call, then it)."""
    t0, t1 = r.get("t_wall_ns") or 0, _end_wall(r)
    w0 = t0 - SLACK_NS
    near = [e for e in cands.within(w0, t1 + SLACK_NS) if id(e) not in used]
    match: Optional[Dict[str, Any]] = near[0] if near else None
    if len(near) > 1:
        op = str(r.get("op"))
        match = next((e for e in near if _compatible(op, e["op"])), near[0])
    m = dict(r)
    m["seq_ours"] = r.get("seq")
    if match is None:
        before = cands.max_seq_before(w0)
        if before is not None:
            m["seq"] = before
            m["fr_unmatched"] = True
            if not cands.ts or cands.ts[-1] <= t1 + SLACK_NS:
                # past the end of torch's dump (taken before our ring was read): torch's
                # numbering goes on one per call; one number for all of them made the
                # ranks' later calls look like different collectives at one seq (a false
                # "completed with mismatched sizes" on a healthy job, seen in a dump)
                key = (str(r.get("group")), m["seq"])
                after[key] = after.get(key, 0) + 1
                m["seq"] += after[key]
        return [m]
    out: List[Dict[str, Any]] = []
    used.add(id(match))
    # further launches of the same Python call (all_gather_object: two all_gathers)
    for e in near if len(near) > 1 else ():
        if e is not match and e["t_wall_ns"] > match["t_wall_ns"] and t0 <= e["t_wall_ns"] <= t1:
            used.add(id(e))
            x = dict(e)
            x["within_op"] = r.get("op")
            out.append(x)
    _join_into(m, match, layouts)
    out.append(m)
    return out


def _join_into(
    m: Dict[str, Any],
    match: Dict[str, Any],
    layouts: Dict[Tuple[str, ...], Tuple[str, ...]],
) -> None:
    """Make ``m`` (a copy of our record) the joined event with its FR entry ``match``: torch's
    seq, the ``fr_*`` fields, FR's frames and state where ours lack them. Returns nothing.
    ``layouts``: the keys to copy of each key layout (``match``'s keys in order) met so far,
    filled here (the FR records of one dump share one layout: testing each of their 33
    keys' names for each joined record was half the join's cost, issue 40)."""
    m["seq"] = match["seq"]
    layout = tuple(match)
    keys = layouts.get(layout)
    if keys is None:
        keys = layouts[layout] = tuple(k for k in layout if k.startswith("fr_") or k == "group_desc")
    for k in keys:
        m[k] = match[k]
    if not m.get("frames") and match.get("frames"):
        m["frames"] = match["frames"]
    if m.get("state") == "issued" and match["state"] != "issued":
        m["state"] = match["state"]
        m["error"] = m.get("error") or match.get("error")
    m["source"] = FR_JOINED_SOURCE


def _with_phase(out: List[Dict[str, Any]], fr_only: List[bool]) -> List[Dict[str, Any]]:
    """FR-only records (C++-issued: DDP's reducer, FSDP, DTensor) take the phase and step
    of this process's newest own record before them (``phase_from`` = 'preceding record'):
    torch's entries carry neither, and the tie-breaks of the analysis (which rank is a step
    ahead, which phase it is in) need them. ``fr_only``: per record of ``out``, whether its
    ``source`` is ``FR_SOURCE``."""
    phase: Any = None
    step: Any = None
    res: List[Dict[str, Any]] = []
    for r, f in zip(out, fr_only):
        if f:
            if r.get("phase") is None and r.get("step") is None and (phase is not None or step is not None):
                r = dict(r, phase=phase, step=step, phase_from="preceding record")
        elif r.get("kind") != "memory":
            phase, step = r.get("phase"), r.get("step")
        res.append(r)
    return res
