"""The ``batch_isend_irecv`` wrapper: one p2p record per P2POp of the batch (flags
F_ASYNC | F_BATCH), on the (group, peer) sequence counters of the single p2p calls, each
completed when its Work is (``torch_dist._on_work_done``). In: the program's call (installed
by ``torch_install``); out: records in the ring of ``torch_dist._state``.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Tuple

from hangtrace.hooks.torchdist import torch_dist as _td
from hangtrace.tracer.ring import layout as F


def _batch_wrapper(
    wrapped: Callable[..., Any], instance: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]
) -> Any:
    """``batch_isend_irecv`` (``wrapped``) recording one async p2p record per P2POp, each
    completed by its own Work (or the last one) through the poller; never raises of ours."""
    ident = _td._get_ident()
    st = _td._state
    if ident in _td._busy or st is None:
        return wrapped(*args, **kwargs)
    idxs: List[int] = []
    try:
        if st.fault:
            raise RuntimeError("hangtrace test fault: recorder failure")
        ops: Any = args[0] if args else kwargs.get("p2p_op_list")  # P2POp list (None: TypeError, logged)
        for p in ops:
            opname = getattr(p.op, "__name__", "isend")
            gsid, gname = _td._group_key(p.group)
            peer = getattr(p, "peer", -1)
            if peer is None:
                peer = st.dist.get_global_rank(p.group, p.group_peer)
            cell = st.seq_cell((gname, int(peer)))
            cell[0] += 1
            seq = cell[0]
            t = p.tensor
            idxs.append(
                st.rec.issue(
                    F.K_P2P,
                    F.OP_IDS.get(opname, F.OP_IDS["isend"]),
                    gsid,
                    seq,
                    t.numel(),
                    _td._shape_id(t.shape),
                    _td._dtype_id(t),
                    int(peer),
                    F.F_ASYNC | F.F_BATCH,
                )
            )
    except Exception as e:
        st.log("recording batch_isend_irecv failed: %r" % (e,), "rec-batch")
    _td._busy[ident] = 1
    try:
        works = wrapped(*args, **kwargs)
    except BaseException as e:
        del _td._busy[ident]
        for i in idxs:
            _td._finish_error(i, e)
        raise
    del _td._busy[ident]
    try:
        if works is not None and len(works) == len(idxs):
            for i, w in zip(idxs, works):
                _td._on_work_done(i, w)
        elif works:
            for i in idxs:
                _td._on_work_done(i, works[-1])
    except Exception as e:
        st.log("batch completion failed: %r" % (e,), "done-batch")
    return works
