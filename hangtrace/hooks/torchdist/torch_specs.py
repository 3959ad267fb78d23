"""What each wrapped torch.distributed function is: its input tensor parameter, peer
parameters, p2p or not, payload kind (data only; used by ``torch_dist``), and the
collective/p2p functions of torch.distributed we do not wrap as such, with the reason.

``tests/unit/test_coverage_torch.py`` derives the collective and p2p functions of the
installed torch from torch itself and fails on one that is in neither table.
:func:`plan_call` resolves once per wrapper where a function's arguments are (a ``CallPlan``:
in, its name and parameter names; out, positions and record fields; ``torch_dist._make_wrapper``).
:func:`param_names` gives a wrapped function's parameter names (``torch_install.install``);
:func:`take_identity` and :func:`wrapped_original` give an installed wrapper its torch
function's identity and read it back (here, not in a module of their own: every module
imported when torch.distributed is costs each traced process ~0.3M instructions, issue 8).
"""

from __future__ import annotations  # the annotations below are not evaluated (~2M instructions)

import functools
from types import FunctionType
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from hangtrace.tracer.ring import layout as F

# name -> (input tensor parameter or None, peer parameter names, is_p2p, payload kind)
# payload kind: "t" tensor, "tl" list of tensors, "tt" one tensor or a list of tensors,
# "o" python object, "ol" object list, None
SPECS: Dict[str, Tuple[Optional[str], Tuple[str, ...], bool, Optional[str]]] = {
    "all_reduce": ("tensor", (), False, "t"),
    "all_gather": ("tensor", (), False, "t"),
    "all_gather_into_tensor": ("input_tensor", (), False, "t"),
    "all_gather_object": ("obj", (), False, "o"),
    "reduce_scatter": ("input_list", (), False, "tl"),
    "reduce_scatter_tensor": ("input", (), False, "t"),
    "all_to_all": ("input_tensor_list", (), False, "tl"),
    "all_to_all_single": ("input", (), False, "t"),
    "broadcast": ("tensor", ("src", "group_src"), False, "t"),
    "broadcast_object_list": ("object_list", ("src", "group_src"), False, "ol"),
    "reduce": ("tensor", ("dst", "group_dst"), False, "t"),
    "gather": ("tensor", ("dst", "group_dst"), False, "t"),
    "gather_object": ("obj", ("dst", "group_dst"), False, "o"),
    "scatter": ("tensor", ("src", "group_src"), False, "t"),
    "scatter_object_list": ("scatter_object_output_list", ("src", "group_src"), False, "ol"),
    "barrier": (None, (), False, None),
    "monitored_barrier": (None, (), False, None),
    "send": ("tensor", ("dst", "group_dst"), True, "t"),
    "recv": ("tensor", ("src", "group_src"), True, "t"),
    "isend": ("tensor", ("dst", "group_dst"), True, "t"),
    "irecv": ("tensor", ("src", "group_src"), True, "t"),
    # torch 2.13 (absent before: install() skips names torch does not have)
    "all_gather_single": ("input_tensor", (), False, "t"),
    "reduce_scatter_single": ("input", (), False, "t"),
    "all_gather_coalesced": ("input_tensor_list", (), False, "tl"),
    "all_reduce_coalesced": ("tensors", (), False, "tt"),
    # one record per call: the two send/recv (or batch_isend_irecv) calls inside are not
    # recorded again (``torch_dist._busy``), so they count once on the (group, peer) seq
    "send_object_list": ("object_list", ("dst", "group_dst"), True, "ol"),
    "recv_object_list": ("object_list", ("src", "group_src"), True, "ol"),
}
GROUP_OPS = ("init_process_group", "new_group", "new_subgroups", "destroy_process_group")
BATCH_OP = "batch_isend_irecv"  # wrapped on its own: one p2p record per P2POp

# Public functions of torch.distributed / distributed_c10d that launch a collective or p2p
# op (directly or through another one) but are not recorded as one of their own.
NOT_APPLICABLE: Dict[str, str] = {
    "init_process_group": "creates the default group (a group record, GROUP_OPS); its only "
    "collective is barrier() (MPI backend), recorded as barrier",
    "new_group": "creates a group (a group record, GROUP_OPS); its only collective is "
    "barrier() (MPI backend), recorded as barrier",
    "new_subgroups": "creates groups through new_group, recorded there",
    "new_subgroups_by_enumeration": "creates groups through new_group, recorded there",
    "breakpoint": "debugging aid (pdb on one rank); its barrier() is recorded as barrier",
}


_ABSENT = 1 << 30  # parameter position of a parameter the function does not have


class CallPlan(NamedTuple):
    """Where one wrapped function's arguments are and what its records say, resolved once
    per wrapper at install (:func:`plan_call`) and read as constants by its call."""

    op_id: int  # the record's op (layout.OP_IDS)
    kind: int  # the record's kind: layout.K_P2P or layout.K_COLL
    is_p2p: bool  # sequence numbers per (group, peer) rather than per group
    pkind: Optional[str]  # payload kind (SPECS); None: the call has no payload
    tpos: int  # position of the payload parameter (_ABSENT: none)
    tkey: str  # its name, for a keyword argument ("" when the spec names none)
    gpos: int  # position of ``group`` (_ABSENT: none)
    apos: int  # position of ``async_op`` (_ABSENT: none)
    peers: Tuple[Tuple[int, str, bool], ...]  # (position, name, is a group rank) per peer parameter
    ppos: int  # position of the peer parameter read inline (_ABSENT: none)
    pname: str  # its name ("": none)
    always_async: bool  # isend/irecv: async whatever the arguments


def position(params: Sequence[str], name: Optional[str]) -> int:
    """Position of parameter ``name`` in ``params``; _ABSENT when the function has none."""
    return params.index(name) if name in params else _ABSENT


def peer_positions(params: Sequence[str], peer_params: Tuple[str, ...]) -> Tuple[Tuple[int, str, bool], ...]:
    """(position, name, is a group rank) of each peer parameter, in the spec's order."""
    return tuple((position(params, p), p, p.startswith("group_")) for p in peer_params)


def inline_peer(peers: Tuple[Tuple[int, str, bool], ...]) -> Tuple[int, str]:
    """The peer parameter read inline per call: the first when it is a plain rank (src/dst,
    as in every spec); the others (group_src/group_dst) are read only when it is None, by
    ``torch_dist._find_peer``. (_ABSENT, "") when none is."""
    return peers[0][:2] if peers and not peers[0][2] else (_ABSENT, "")


def plan_call(name: str, params: Sequence[str]) -> CallPlan:
    """The CallPlan of the wrapped function ``name`` (a key of SPECS) whose parameter names
    are ``params``, in order."""
    tparam, peer_params, is_p2p, pkind = SPECS[name]
    peers = peer_positions(params, peer_params)
    ppos, pname = inline_peer(peers)
    return CallPlan(
        F.OP_IDS[name],
        F.K_P2P if is_p2p else F.K_COLL,
        is_p2p,
        pkind,
        position(params, tparam),
        tparam or "",  # = tparam wherever a payload is read (every spec with one names it)
        position(params, "group"),
        position(params, "async_op"),
        peers,
        ppos,
        pname,
        name in ("isend", "irecv"),
    )


_CO_VARARGS, _CO_VARKEYWORDS = 0x04, 0x08  # code flags (CPython Include/cpython/code.h; inspect.CO_*)


def param_names(fn: Any) -> Optional[List[str]]:
    """``list(inspect.signature(fn).parameters)`` read from the code object of the function
    behind ``fn``'s ``__wrapped__`` chain, without building a Signature (27 of them cost
    about 2M instructions of a rank's start-up). None when that does not apply - something
    in the chain has a ``__signature__``, or the innermost object is not a plain Python
    function - and the caller then asks ``inspect.signature``. Order as inspect gives it:
    positional (only or not), ``*args``, keyword-only, ``**kwargs``."""
    f = fn
    for _ in range(100):  # inspect.unwrap's guard against cycles is a set; a bound is enough
        if getattr(f, "__signature__", None) is not None:
            return None
        inner = getattr(f, "__wrapped__", None)
        if inner is None:
            break
        f = inner
    else:
        return None
    if not isinstance(f, FunctionType):
        return None
    code = f.__code__
    npos, nkw = code.co_argcount, code.co_kwonlyargcount
    names = code.co_varnames
    out = list(names[:npos])
    at = npos + nkw
    if code.co_flags & _CO_VARARGS:
        out.append(names[at])
        at += 1
    out += names[npos : npos + nkw]
    if code.co_flags & _CO_VARKEYWORDS:
        out.append(names[at])
    return out


def take_identity(w: Any, orig: Callable[..., Any]) -> Any:
    """Give ``w`` the identity of ``orig`` (name, qualified name, module, docstring, its
    ``__dict__``) and mark it ``__hangtrace_wrapped__ = orig``; returns ``w``.

    For plain functions this is ``functools.update_wrapper`` (which also sets
    ``__wrapped__``); a ``_fastrec.Call`` has a read-only ``__wrapped__`` of its own.
    """
    if isinstance(w, type(take_identity)):
        functools.update_wrapper(w, orig)
    else:
        for attr in ("__module__", "__name__", "__qualname__", "__doc__"):
            try:
                setattr(w, attr, getattr(orig, attr))
            except AttributeError:
                pass
        w.__dict__.update(getattr(orig, "__dict__", {}))
    w.__hangtrace_wrapped__ = orig
    return w


def plain_wrapper(
    orig: Callable[..., Any],
    wrapper: Callable[[Callable[..., Any], Any, Tuple[Any, ...], Dict[str, Any]], Any],
) -> Callable[..., Any]:
    """``orig`` wrapped by ``wrapper(wrapped, instance, args, kwargs)`` (the batch and group
    operations), as a plain function with ``orig``'s identity."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return wrapper(orig, None, args, kwargs)

    return take_identity(call, orig)


def wrapped_original(fn: Any) -> Optional[Callable[..., Any]]:
    """The original torch function behind an installed wrapper ``fn``, or None."""
    return getattr(fn, "__hangtrace_wrapped__", None)
