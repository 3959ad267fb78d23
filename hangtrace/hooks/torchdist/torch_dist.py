"""Wrappers around the public torch.distributed API that record into the ring: the
per-process State (``_state``, None = not recording) and the recording call of each wrapped
function (``_make_wrapper``), with the per-call helpers the C call also calls back.
In: the program's calls; out: records in the ring. Installed by ``torch_install``.

Installed by a post-import hook on ``torch.distributed`` (or at once if it is already imported).
Each wrapped function is replaced, by the same function-like object (``torch_install._wrap``; no wrapt: it
is the hot path, and importing wrapt cost ~17 ms of every rank's start-up), both in
``torch.distributed`` and in ``torch.distributed.distributed_c10d``; calls made *inside* a wrapped
call on the same thread (``all_gather_object`` calling ``all_gather``, ...) are not recorded again.

Not seen by these wrappers (torch calls C++ directly): DDP's gradient all-reduce and functional
collectives (``torch.distributed._functional_collectives``). Source: torch 2.13
``torch/nn/parallel/distributed.py`` uses the C++ reducer; torch's own Flight Recorder sees those.

Sequence numbers are ours, counted per group name: collectives on one counter, p2p on one counter
per (group, peer). Every rank that calls the same Python API in the same order gets the same
numbers, which is what the cross-rank alignment needs.

Per-call work: with the optional C extension (``_fastrec``, see ``torch_install._wrap``) the installed
function is a ``_fastrec.Call`` that does what ``_make_wrapper``'s ``call`` does and calls back
into Python only on cache misses and rare cases; ``HANGTRACE_PURE_PYTHON=1`` or a build without a
compiler gives the Python ``call``, with the same records. Annotations only: nothing from
``typing`` runs per call (helpers that run per call read ``_state`` unchecked, see below).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

from hangtrace.tracer.ring import layout as F
from hangtrace.hooks.record.recorder import _fastrec

from hangtrace.hooks.torchdist.torch_completion import _poller
from hangtrace.hooks.torchdist.torch_specs import CallPlan, plan_call
from hangtrace.hooks.torchdist.torch_state import GroupEntry, Log, State

if TYPE_CHECKING:
    from hangtrace.hooks.record.recorder import Recorder


# Threads (by ``threading.get_ident()``) inside a wrapped call: calls they make from there
# (``all_gather_object`` calling ``all_gather``, ...) are not recorded again. With the C
# extension a ``_fastrec.Busy`` (the calling thread's entry a thread-local flag); else a dict.
_busy: Dict[int, int] = _fastrec.Busy() if _fastrec is not None else {}
_get_ident = threading.get_ident


if _fastrec is not None:
    from hangtrace.hooks._fastrec import Counter as _Counter, StateBase as _StateBase  # (loaded already)

    class _FastState(_StateBase, State):
        """State whose fields the C wrappers (``_fastrec.Call``) read directly; ``rec`` also keeps
        the recorder's C Ring (None for a pure-Python recorder); C advances its Counter cells."""

        new_cell = staticmethod(_Counter)


def _new_state(recorder: Recorder, log: Log) -> State:
    """A State for ``recorder``: the C-readable one when the recorder has a C Ring."""
    if _fastrec is not None and getattr(recorder, "_fast", None) is not None:
        return _FastState(recorder, log)
    return State(recorder, log)


# The current State (None = not recording), read at every call by the C and Python wrappers.
_state: Optional[State] = None

# Per-call helpers read ``_state`` unchecked (callers checked; a check would cost every call):
# those lines carry "type: ignore[union-attr]".


def _group_entry(group: Any) -> GroupEntry:
    """Cached ``(strid, name, pg, st.seq[name])`` of ``group`` (None = default), by id(group).

    The entry holds the group object itself so that its id is not reused while cached.
    """
    st = _state
    assert st is not None  # a cache miss (once per group), called while recording
    key = None if group is None else id(group)
    g = st.groups.get(key)
    if g is not None:
        return g
    dist = st.dist
    pg = group
    if pg is None:
        pg = dist.distributed_c10d._get_default_group()
    try:
        name = dist.distributed_c10d._get_process_group_name(pg)
    except Exception:
        name = getattr(pg, "group_name", None) or "?"
    sid = st.rec.intern(name)
    g = st.groups[key] = (sid, name, group, st.seq_cell(name))
    _probe_tensor_layout(st)  # once per process (at init_process_group when that was hooked)
    return g


def _group_key(group: Any) -> Tuple[int, str]:
    """(strid, name) of ``group`` (None = default group); cached per group object."""
    g = _group_entry(group)
    return g[0], g[1]


def _dtype_id(t: Any) -> int:
    dt = t.dtype
    d = _state.dtypes.get(dt)  # type: ignore[union-attr]  # per call (see above)
    if d is None:
        d = _state.dtypes[dt] = F.DTYPE_IDS.get(str(dt).replace("torch.", ""), 0)  # type: ignore[union-attr]
    return d


def _shape_id(shape: Any) -> int:
    s = _state.shapes.get(shape)  # type: ignore[union-attr]  # per call (see above)
    if s is None:
        s = _state.shapes[shape] = _state.rec.intern(  # type: ignore[union-attr]
            "x".join(str(int(d)) for d in shape) or "scalar"
        )
    return s


def _payload(kind: Optional[str], obj: Any) -> Tuple[int, int, int]:
    """(numel, shape strid, dtype id) of the op's payload."""
    if kind == "t":
        return obj.numel(), _shape_id(obj.shape), _dtype_id(obj)
    if kind == "tl":
        if not obj:
            return 0, 0, 0
        return sum(t.numel() for t in obj), _shape_id(obj[0].shape), _dtype_id(obj[0])
    if kind == "ol":
        return len(obj), 0, F.DTYPE_IDS["object"]
    if kind == "o":
        return -1, 0, F.DTYPE_IDS["object"]
    if kind == "tt":  # one tensor or a list of them (all_reduce_coalesced)
        return _payload("tl" if isinstance(obj, (list, tuple)) else "t", obj)
    return 0, 0, 0


def _payload_tt(kind: Optional[str], obj: Any) -> Tuple[int, int, int]:
    """``_payload`` of a "tt" payload for the C call, which knows kind "tl" (not "tt")."""
    return _payload("tt", obj)


def _find_peer(
    st: State,
    group: Any,
    peers: Tuple[Tuple[int, str, bool], ...],
    args: Tuple[Any, ...],
    kwargs: Dict[str, Any],
) -> int:
    """The call's peer (global rank) from the first of ``peers`` ((position, name, is a group
    rank)) given, a group rank mapped to its global rank; -1 when none is given."""
    n = len(args)
    for pos, pname, is_group_rank in peers:
        v = args[pos] if pos < n else (kwargs.get(pname) if kwargs else None)
        if v is not None:
            if is_group_rank:
                v = st.dist.get_global_rank(group, v) if group is not None else v
            return int(v)
    return -1


# Per call (a failed or an async op): ``_state`` is read unchecked (see above).
def _finish_error(idx: int, e: BaseException) -> None:
    """The record ``idx`` completes as failed with ``e``."""
    try:
        _state.rec.complete(idx, err="%s: %s" % (type(e).__name__, e))  # type: ignore[union-attr]
    except Exception as e2:
        _state.log("recording a failure failed: %r" % (e2,), "fail-rec")  # type: ignore[union-attr]


def _on_work_done(idx: int, work: Any) -> None:
    """Record completion of an async op when its Work finishes (the Work itself is untouched),
    seen by our poller thread (``torch_completion``: why not a future callback)."""
    _poller().add(idx, work, _state.rec)  # type: ignore[union-attr]


def _probe_tensor_layout(st: State) -> None:
    """The C path records: find its tensors' layout (``tensor_layout``) once per process, when
    it joins its process group or else at its first collective (its first group entry, made
    however the group was made), and say in the run log what it found. Never raises."""
    global _layout_probed
    if _layout_probed or not getattr(st, "fast", False):  # only the C State has .fast
        return
    _layout_probed = True
    try:
        from hangtrace.hooks.record import tensor_layout
        import torch

        st.log("tensor layout: %s" % (tensor_layout.probe(torch),), "tensor-layout")
    except Exception as e:
        st.log("tensor layout not probed (torch's getters are used): %r" % (e,), "tensor-layout")


_layout_probed = False


def _failed(idx: int, e: BaseException) -> None:
    """The wrapped call raised ``e``: its record ``idx`` (0 = none was issued) completes as failed."""
    if idx:
        _finish_error(idx, e)


def _make_wrapper(name: str, params: List[str], wrapped: Callable[..., Any]) -> Callable[..., Any]:
    """The recording call of ``name`` (parameter names ``params``, in order) around ``wrapped``.

    Returns ``call(*args, **kwargs)``: the installed function itself on the pure-Python path,
    the C call's fallback otherwise (``torch_install._wrap``).

    Hot path: one call per collective. Positions and flags are resolved here, once
    (``torch_specs.plan_call``); the common case (tensor payload, cached group/shape/dtype)
    makes no Python-level calls besides ``issue`` (``_issuer``: the record of its start),
    ``Recorder.issue``/``complete`` and the tensor's ``numel``/``shape``/``dtype``.
    """
    issue = _issuer(name, plan_call(name, params))
    failed = _failed
    busy = _busy
    get_ident = _get_ident

    def call(*args: Any, **kwargs: Any) -> Any:
        st = _state
        ident = get_ident()
        if st is None or ident in busy:
            return wrapped(*args, **kwargs)
        idx, flags = issue(st, args, kwargs)
        busy[ident] = 1
        try:
            result = wrapped(*args, **kwargs)
        except BaseException as e:
            del busy[ident]
            failed(idx, e)
            raise
        del busy[ident]
        if idx:
            try:
                if flags and result is not None:
                    _on_work_done(idx, result)
                else:
                    st.rec.complete(idx)
            except Exception as e:
                st.log("completing %s failed: %r" % (name, e), "done-" + name)
        return result

    return call


def _issuer(name: str, plan: CallPlan) -> Callable[[State, Tuple[Any, ...], Dict[str, Any]], Tuple[int, int]]:
    """The step of ``name``'s call that records its start: ``issue(st, args, kwargs)``
    reads the group, peer, payload and async flag where ``plan`` says they are, advances the
    sequence counter and issues the record; returns (its index, its flags: F_ASYNC for an
    async op, which its Work completes). A failure is logged once per op and gives index 0
    (no record). A payload not of its kind (torch raises that to the user) records 0, 0, 0."""
    op_id, kind, is_p2p, pkind, tpos, tkey, gpos, apos, peers, ppos, pname, always_async = plan
    find_peer = _find_peer
    has_payload = pkind is not None
    tensor_payload = pkind == "t"
    f_async = F.F_ASYNC
    group_entry = _group_entry
    shape_id = _shape_id
    dtype_id = _dtype_id
    payload = _payload

    def issue(st: State, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tuple[int, int]:
        flags = 0
        try:
            if st.fault:
                raise RuntimeError("hangtrace test fault: recorder failure")
            n = len(args)
            group = args[gpos] if gpos < n else (kwargs.get("group") if kwargs else None)
            g = st.groups.get(None if group is None else id(group)) or group_entry(group)
            peer = -1
            if peers:
                v = args[ppos] if ppos < n else (kwargs.get(pname) if kwargs else None)
                peer = int(v) if v is not None else find_peer(st, group, peers, args, kwargs)
            shape: Optional[int]  # (annotations only: no code per call)
            dtype: Optional[int]
            numel = shape = dtype = 0
            if has_payload:
                obj = args[tpos] if tpos < n else (kwargs.get(tkey) if kwargs else None)
                try:  # a wrong argument type: torch raises it to the user; we still record the call
                    if obj is None:
                        pass
                    elif tensor_payload:
                        numel = obj.numel()
                        shp = obj.shape
                        shape = st.shapes.get(shp)
                        if shape is None:
                            shape = shape_id(shp)
                        dtype = st.dtypes.get(obj.dtype)
                        if dtype is None:
                            dtype = dtype_id(obj)
                    else:
                        numel, shape, dtype = payload(pkind, obj)
                except Exception:
                    numel = shape = dtype = 0
            if always_async:
                flags = f_async
            else:
                a = args[apos] if apos < n else (kwargs.get("async_op") if kwargs else None)
                flags = f_async if a else 0
            cell = st.seq_cell((g[1], peer)) if is_p2p else g[3]
            cell[0] += 1
            seq = cell[0]
            return st.rec.issue(kind, op_id, g[0], seq, numel, shape, dtype, peer, flags), flags
        except Exception as e:
            st.log("recording %s failed: %r" % (name, e), "rec-" + name)
            return 0, flags

    return issue


def _global_rank(group: Any, rank: int) -> int:
    return _state.dist.get_global_rank(group, rank)  # type: ignore[union-attr]  # per call (see above)


def reset_after_fork(recorder: Recorder) -> None:
    """A forked child keeps the wrappers but records into its own ring."""
    if _state is not None:
        _state.rec = recorder
