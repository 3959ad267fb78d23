"""Incident: FSDP2 (`fully_shard`) gradient accumulation where one rank runs one micro-batch
more than the others.

Each rank computes its number of micro-batches from the length of its OWN data shard
(`ceil(len(local) / micro_bs)`), and the last rank's shard is a few samples longer, so at
step 1 it runs 3 micro-batches while the others run 2. FSDP2 issues its parameter
all-gathers (forward, and again in backward with reshard_after_forward=True) and its
gradient reduce-scatters from inside the module hooks, not from user code. The other
ranks finish their 2 micro-batches, take the optimizer step and go into the loss
all_reduce for logging, then a barrier; the last rank's extra micro-batch issues an FSDP
all-gather that no other rank ever matches.

Expected verdict: the last rank (rank 1) is the culprit; its FSDP all-gather (or
reduce-scatter) in the extra micro-batch has no partner (the others wait in their
logging all_reduce / barrier). kind: collective-mismatch or skipped-collective.
torchrun launcher, 2 ranks, gloo, CPU, 1-D DeviceMesh("cpu").
"""
LAUNCH = "torchrun"
NPROC = 2
EXPECT = {"kind": ("collective-mismatch", "skipped-collective"), "culprit_ranks": [1], "cause": None}

import datetime
import math
import os
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

try:
    from hangtrace import tracer
except Exception:  # tracing optional
    tracer = None


class _Nop:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def phase(name):
    return tracer.phase(name) if tracer is not None else _Nop()


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(32, 64)
        self.l2 = torch.nn.Linear(64, 64)
        self.l3 = torch.nn.Linear(64, 1)

    def forward(self, x):
        return self.l3(torch.relu(self.l2(torch.relu(self.l1(x)))))


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    torch.manual_seed(0)
    model = MLP()
    for layer in (model.l1, model.l2, model.l3):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    micro_bs = 4
    g = torch.Generator().manual_seed(rank)
    for step in range(3):
        if tracer is not None:
            tracer.step(step)
        # step 1: the last rank's shard has 9 samples -> ceil(9/4) = 3 micro-batches; others 8 -> 2
        n_local = 9 if (step == 1 and rank == world - 1) else 8
        x = torch.randn(n_local, 32, generator=g)
        y = torch.randn(n_local, 1, generator=g)
        n_micro = math.ceil(n_local / micro_bs)
        print(f"rank {rank}: step {step}: {n_micro} micro-batches", flush=True)
        with phase("train"):
            for m in range(n_micro):
                xb, yb = x[m * micro_bs:(m + 1) * micro_bs], y[m * micro_bs:(m + 1) * micro_bs]
                loss = torch.nn.functional.mse_loss(model(xb), yb) / n_micro
                loss.backward()
                print(f"rank {rank}: step {step} micro {m} loss {loss.item():.4f}", flush=True)
                time.sleep(0.2)
            opt.step()
            opt.zero_grad()
        with phase("log"):
            t = loss.detach().clone()
            dist.all_reduce(t)
            print(f"rank {rank}: step {step} mean loss {t.item() / world:.4f}", flush=True)
    dist.barrier()
    print(f"rank {rank}: done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
