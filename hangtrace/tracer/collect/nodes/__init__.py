"""Several nodes of one torchrun job, without Ray (issue 39; docs/MULTINODE.md).

In: this node's run directory (its ring files' ``launch_*`` meta: the launcher's node rank
and the job's torch.distributed store), the job's own ``TCPStore`` (or a shared directory),
other nodes' summaries. Out: a :class:`identity.NodeIdentity`, node summaries (compact,
versioned bytes: ``summaryformat``), the meeting over the store (``meeting``), and
snapshot folders joined with other nodes' parts (``jobsnap``).

``identity``: who this node is; ``summaryformat``: a node's snapshot as a summary and
back; ``storelink``: bounded-time key/value access to the job's store or a shared
directory; ``meeting``: the protocol (register, trigger, parts, verdict); ``jobsnap``:
parts stored in a snapshot folder, read back, and several node-local run directories
combined (``hangtrace analyze DIR1 DIR2``).
"""
