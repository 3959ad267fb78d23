"""Installing the torch.distributed hooks: each public collective, p2p, batch and group
function of ``torch.distributed`` (and ``distributed_c10d``) replaced by its wrapper, and
restored by ``uninstall``. In: the imported ``torch.distributed`` module, the recorder and
the run log; out: the wrappers in place (the C ``_fastrec.Call`` or the Python call of
``torch_dist._make_wrapper``; ``torch_batch``; ``torch_groups``) and ``torch_dist._state``
set (None after ``uninstall``).
"""

from __future__ import annotations

import inspect
import sys
from typing import TYPE_CHECKING, Any, Callable, Dict, List

from hangtrace.hooks.record.recorder import _fastrec
from hangtrace.hooks.torchdist import torch_dist as _td
from hangtrace.hooks.torchdist.torch_batch import _batch_wrapper
from hangtrace.hooks.torchdist.torch_groups import _group_op_wrapper, record_existing_groups
from hangtrace.hooks.torchdist.torch_specs import (
    _ABSENT,
    BATCH_OP,
    GROUP_OPS,
    SPECS,
    param_names,
    plain_wrapper,
    take_identity,
    wrapped_original,
)
from hangtrace.hooks.torchdist.torch_state import Log
from hangtrace.tracer.ring import layout as F

if TYPE_CHECKING:
    from hangtrace.hooks.record.recorder import Recorder

_installed: Dict[str, Callable[..., Any]] = {}  # attribute name -> original function


def _wrap(name: str, orig: Callable[..., Any], params: List[str]) -> Callable[..., Any]:
    """The function installed in place of ``orig``: no proxy object around it, so a call
    costs one call (our own code: the per-collective hot path).

    The C ``_fastrec.Call`` when the current State is C readable (extension built,
    recorder with a C Ring), else the Python ``call``; the C call does what ``call`` does
    and falls back to ``call`` itself when ``_state`` is a plain-Python State or fault
    injection is on. Either one binds like a function, pickles by reference (module and
    qualified name), has ``__wrapped__`` (so ``inspect.signature`` gives the original's)
    and ``__hangtrace_wrapped__`` = ``orig``.
    """
    call = _td._make_wrapper(name, params, orig)
    if _fastrec is not None and isinstance(_td._state, _td._FastState):
        try:
            return take_identity(_fast_call(name, orig, params, call), orig)
        except Exception as e:  # the Python call records the same
            _td._state.log("C wrapper of %s unavailable, Python used: %r" % (name, e), "fastcall-" + name)
    return take_identity(call, orig)


def _fast_call(name: str, orig: Callable[..., Any], params: List[str], call: Callable[..., Any]) -> Any:
    """The C recording call of ``name`` (``_fastrec.Call``), same arguments as ``call``."""
    assert _fastrec is not None  # at install, by _wrap, which checked
    tparam, peer_params, is_p2p, pkind = SPECS[name]
    payload = _td._payload
    if pkind == "tt":  # C knows t, tl, o, ol; any kind but "t" calls back ``payload``
        pkind, payload = "tl", _td._payload_tt
    torch = sys.modules.get("torch")
    if torch is not None:
        _fastrec.set_tensor_type(torch.Tensor)
    pos = {p: i for i, p in enumerate(params)}
    peers = tuple((pos.get(p, _ABSENT), p, p.startswith("group_")) for p in peer_params)
    return _fastrec.Call(
        orig,
        call,
        name,
        F.OP_IDS[name],
        F.K_P2P if is_p2p else F.K_COLL,
        is_p2p,
        pkind,
        tparam,
        pos.get(tparam, _ABSENT) if tparam else _ABSENT,
        pos.get("group", _ABSENT),
        pos.get("async_op", _ABSENT),
        peers,
        name in ("isend", "irecv"),
        vars(_td),  # (torch_dist's globals: the C call reads its ``_state`` there)
        _td._busy,
        (
            _td._group_entry,
            _td._shape_id,
            _td._dtype_id,
            payload,
            _td._on_work_done,
            _td._finish_error,
            _td._global_rank,
        ),
    )


def install(dist: Any, recorder: Recorder, log: Log) -> int:
    """Wrap torch.distributed's API (``dist`` is the imported module). Idempotent.

    Returns the number of functions wrapped.
    """
    import os
    from hangtrace.tracer import config

    if _td._state is None:
        _td._state = _td._new_state(recorder, log)
        _td._state.dist = dist
        _td._state.fault = os.environ.get(config.FAULT) == "recorder"
    c10d = dist.distributed_c10d
    count = 0
    for name in list(SPECS) + [BATCH_OP] + list(GROUP_OPS):
        if name in _installed:
            continue
        orig = getattr(c10d, name, None)
        if orig is None or wrapped_original(orig) is not None:
            continue
        if name in SPECS:
            try:
                params = param_names(orig) or list(inspect.signature(orig).parameters)
            except (TypeError, ValueError):
                continue
            w = _wrap(name, orig, params)
        elif name == BATCH_OP:
            w = plain_wrapper(orig, _batch_wrapper)
        elif name == "new_subgroups":
            continue  # recorded through the new_group calls it makes
        else:
            w = plain_wrapper(orig, _group_op_wrapper)
        _installed[name] = orig
        setattr(c10d, name, w)
        if getattr(dist, name, None) is orig:
            setattr(dist, name, w)
        count += 1
    try:
        record_existing_groups()
    except Exception as e:
        log("recording existing groups failed: %r" % (e,), "existing-groups")
    return count


def uninstall() -> None:
    """Restore the original functions in both modules and forget the recorder.

    A later ``install()`` starts afresh (new recorder, sequence numbers from 1).
    """
    _td._state = None
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        _installed.clear()
        return
    c10d = dist.distributed_c10d
    for name, orig in list(_installed.items()):
        cur = getattr(c10d, name, None)
        if wrapped_original(cur) is orig:
            setattr(c10d, name, orig)
        if wrapped_original(getattr(dist, name, None)) is orig:
            setattr(dist, name, orig)
        del _installed[name]
