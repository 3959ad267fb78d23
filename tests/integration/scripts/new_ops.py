"""A 2-rank gloo job calling the collective and p2p functions torch 2.13 added to what we
record (tests/integration/test_new_ops.py): one of each, then the object-list p2p pair."""

import os
import warnings

import torch
import torch.distributed as dist

warnings.simplefilter("ignore", FutureWarning)  # the *_coalesced functions are deprecated
rank = int(os.environ["RANK"])
ws = int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo")
out = torch.zeros(ws * 4)
dist.all_gather_single(out, torch.full((4,), float(rank)))
assert out.tolist() == sum(([float(r)] * 4 for r in range(ws)), [])
o = torch.zeros(3, dtype=torch.float64)
dist.reduce_scatter_single(o, torch.ones(ws * 3, dtype=torch.float64))  # gloo: no stack form
assert o.tolist() == [float(ws)] * 3
outs = [[torch.zeros(2), torch.zeros(3)] for _ in range(ws)]
dist.all_gather_coalesced(outs, [torch.ones(2) * rank, torch.ones(3)])
assert outs[ws - 1][0].tolist() == [ws - 1.0] * 2
ts = [torch.ones(2, 5), torch.ones(3)]
dist.all_reduce_coalesced(ts)
assert ts[1].tolist() == [float(ws)] * 3
dist.all_reduce_coalesced(torch.ones(6, dtype=torch.int64))
fut = dist.all_reduce_coalesced([torch.ones(7)], async_op=True)
fut.wait()
dist.all_gather_into_tensor(torch.zeros(ws * 2), torch.ones(2))  # calls all_gather_single: one record
peer = 1 - rank
if rank == 0:
    dist.send_object_list(["foo", {1: 2}, 3], dst=1)
    dist.send_object_list([b"x" * 1000], group_dst=1, use_batch=True)
    dist.send(torch.ones(5), 1)
else:
    a = [None, None, None]
    assert dist.recv_object_list(a, src=0) == 0 and a == ["foo", {1: 2}, 3]
    b = [None]
    assert dist.recv_object_list(b, group_src=0, use_batch=True) == 0 and b == [b"x" * 1000]
    dist.recv(torch.zeros(5), 0)
dist.barrier()
print("done", rank, flush=True)
dist.destroy_process_group()
