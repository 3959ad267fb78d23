"""A gloo job touching every recorded kind: sync, async, p2p, batch p2p, subgroup, objects."""

import os

import torch
import torch.distributed as dist
from hangtrace import tracer

rank = int(os.environ["RANK"])
ws = int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo")
pairs = [dist.new_group([i, i + 1]) for i in range(0, ws - 1, 2)]
mine = pairs[rank // 2] if rank // 2 < len(pairs) else None
for step in range(3):
    tracer.step(step)
    with tracer.phase("train"):
        t = torch.ones(4)
        dist.all_reduce(t)
        w = dist.all_reduce(torch.ones(2, 3), async_op=True)
        w.wait()
        out = [torch.zeros(4) for _ in range(ws)]
        dist.all_gather(out, t)
        dist.broadcast(t, src=ws - 1)
        objs = [None] * ws
        dist.all_gather_object(objs, {"rank": rank})
        if mine is not None:
            dist.all_reduce(torch.ones(8, dtype=torch.float64), group=mine)
        peer = rank ^ 1
        if peer < ws:
            if rank % 2 == 0:
                dist.send(t, peer)
                dist.recv(t, peer)
            else:
                dist.recv(t, peer)
                dist.send(t, peer)
            ops = [dist.P2POp(dist.isend, torch.ones(3), peer), dist.P2POp(dist.irecv, torch.zeros(3), peer)]
            for w in dist.batch_isend_irecv(ops if rank % 2 == 0 else ops[::-1]):
                w.wait()
dist.barrier()
print("done", rank, flush=True)
dist.destroy_process_group()
