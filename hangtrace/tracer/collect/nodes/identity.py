"""Which node of a multi-node job this run directory belongs to (issue 39).

In: the ring files of a node-local run directory; each rank recorded its launcher's facts
at ``init_process_group`` as ring meta ``launch_*`` (``hooks/torchdist/torch_groups.py``:
``GROUP_RANK``/``NODE_RANK``/``SLURM_NODEID``, ``GROUP_WORLD_SIZE``/``NNODES``/``SLURM_NNODES``,
``MASTER_ADDR``/``MASTER_PORT``, ``TORCHELASTIC_RUN_ID``, ``TORCHELASTIC_RESTART_COUNT``).
Out: a :class:`NodeIdentity`, or None for a single-node job or a run without such facts.

A node is known by the launcher's node rank with the host name: two nodes simulated on
one machine, or containers, share a host name. torchelastic gives global ranks by node
rank, so node 0 holds global rank 0 (the node that assembles the job-wide verdict).
"""

from __future__ import annotations

import glob
import os
import socket
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, Tuple


@dataclass(frozen=True)
class NodeIdentity:
    """One node of a job: ``node_rank`` of ``node_count`` (launcher's), ``host`` (this
    node's host name), ``store`` (host, port) of the job's torch.distributed store, ``job``
    (the launcher's run id and restart count, ``'<id>.<restart>'``: the key prefix of the
    meeting), ``ranks`` (global ranks of this node's processes that recorded the facts)."""

    node_rank: int
    node_count: int
    host: str
    store: Tuple[str, int]
    job: str
    ranks: Tuple[int, ...] = ()

    @property
    def label(self) -> str:
        """``'node 1 (host h)'``."""
        return "node %d (%s)" % (self.node_rank, self.host)


def identity_of(
    metas: Iterable[Tuple[int, Mapping[str, Any]]], host: Optional[str] = None
) -> Optional[NodeIdentity]:
    """The identity agreed by most ranks of ``metas`` ((global rank, ring meta) pairs), or
    None when no rank recorded a node rank, node count > 1 and a store address."""
    votes: "Counter[Tuple[int, int, str, int, str]]" = Counter()
    ranks = []
    for rank, m in metas:
        try:
            key = (
                int(m["launch_node_rank"]),
                int(m["launch_node_count"]),
                str(m["launch_store_addr"]),
                int(m["launch_store_port"]),
                "%s.%s" % (m.get("launch_elastic_run_id", "job"), m.get("launch_elastic_restart", "0")),
            )
        except (KeyError, TypeError, ValueError):
            continue
        if key[1] <= 1:
            continue
        votes[key] += 1
        if rank >= 0:
            ranks.append(rank)
    if not votes:
        return None
    (node_rank, count, addr, port, job), _ = votes.most_common(1)[0]
    return NodeIdentity(
        node_rank, count, host or socket.gethostname(), (addr, port), job, tuple(sorted(ranks))
    )


def find_identity(run_dir: str) -> Optional[NodeIdentity]:
    """:func:`identity_of` the ring files of ``run_dir`` (unreadable rings are skipped);
    None when none says it is part of a multi-node job. Never raises."""
    from hangtrace.tracer.ring import reader as R

    metas = []
    for path in glob.glob(os.path.join(run_dir, "ring-*.htr")):
        try:
            ring = R.read_ring(path, records=False)
        except Exception:
            continue
        if "launch_node_rank" in ring.meta:
            metas.append((int(ring.header.get("rank", -1)), ring.meta))
    return identity_of(metas)
