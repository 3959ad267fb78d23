"""Incident: per-sample losses are kept as a DTensor sharded over the data-parallel mesh
(`DTensor.from_local(..., [Shard(0)])`). A logging path turns it into a full tensor
(`.redistribute(mesh, [Replicate()])`, i.e. a functional all_gather issued by DTensor from
C++/functional collectives, not by a Python `torch.distributed.all_gather*` call) under
`if rank == 0 and step == 3:`. Only rank 0 takes the branch. Every step ends with a
`dist.barrier()` (step timing), so rank 1 goes straight to its step-3 barrier while rank 0
sits in the DTensor all-gather.

Expected verdict: rank 0 is the culprit, with the DTensor/functional all_gather issued only
on rank 0 at step 3 (from the logging branch, dtensor_rank0_redistribute.py); rank 1 waits
in barrier. kind: collective-mismatch (or skipped-collective). torchrun, 2 ranks, gloo,
1-D DeviceMesh("cpu").
"""
LAUNCH = "torchrun"
NPROC = 2
EXPECT = {"kind": ("collective-mismatch", "skipped-collective"), "culprit_ranks": [0], "cause": None}

import datetime
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    for p in model.parameters():
        dist.broadcast(p.data, src=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)

    for step in range(8):
        t0 = time.time()
        x, y = torch.randn(8, 32, generator=g), torch.randn(8, 1, generator=g)
        opt.zero_grad()
        per_sample = ((model(x) - y) ** 2).squeeze(1)
        per_sample.mean().backward()
        flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        dist.all_reduce(flat)
        flat /= world
        off = 0
        for p in model.parameters():
            p.grad.copy_(flat[off:off + p.numel()].view_as(p))
            off += p.numel()
        opt.step()
        losses = DTensor.from_local(per_sample.detach(), mesh, [Shard(0)])
        if rank == 0 and step == 3:     # BUG: histogram of all per-sample losses, logging rank only
            full = losses.redistribute(mesh, [Replicate()]).to_local()
            print(f"[log] step {step} max per-sample loss {full.max().item():.4f}", flush=True)
        dist.barrier()                  # step timing
        print(f"rank {rank}: step {step} done in {time.time() - t0:.2f}s", flush=True)
        time.sleep(0.2)
    print(f"rank {rank}: done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
