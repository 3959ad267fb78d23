"""Incident (transformers PR 48237, after the first fix): the rank whose expert shard is empty
no longer crashes; instead it takes an "empty shard" branch that runs a dummy all_reduce to
"stay in sync" -- a collective the ranks with experts never issue. At step 2 rank 2 blocks in
that extra all_reduce while ranks 0 and 1 go on to the end-of-step barrier. torchrun,
3 ranks, DataLoader with 2 persistent workers, phases/steps instrumented.
"""
LAUNCH = "torchrun"
NPROC = 3
EXPECT = {"kind": "collective-mismatch", "culprit_ranks": [2], "cause": None}

import datetime
import os
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

from hangtrace import tracer

HID = 8


class Batches(Dataset):
    def __len__(self):
        return 60

    def __getitem__(self, i):
        return torch.randn(HID)


def shard_experts(rank, world, num_experts):
    per = max(1, num_experts // world)
    start = rank * per
    return list(range(start, min(start + per, num_experts)))


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"rank {rank} pid {os.getpid()} up", flush=True)
    experts = torch.nn.ModuleList([torch.nn.Linear(HID, HID) for _ in range(world)])
    loader = DataLoader(Batches(), batch_size=world * 2, num_workers=2, persistent_workers=True)
    for step, x in enumerate(loader, start=1):
        tracer.step(step)
        with tracer.phase("moe"):
            recv = torch.empty_like(x)
            dist.all_to_all_single(recv, x.contiguous())
            num_experts = world if step < 2 else world - 1          # resize at step 2
            local = shard_experts(rank, world, num_experts)
            if not local:
                y = torch.zeros_like(recv)          # empty shard: contributes zeros
            else:
                y = torch.stack([experts[e](recv) for e in local]).mean(0)
            back = torch.empty_like(y)
            dist.all_to_all_single(back, y.detach().contiguous())
            if not local:
                # the "fix": keep the empty-shard rank in lockstep with a dummy expert-grad sync
                dummy = torch.zeros(1)
                dist.all_reduce(dummy)
        with tracer.phase("sync"):
            dist.barrier()
        print(f"rank {rank} step {step} local_experts={local}", flush=True)
        time.sleep(0.2)
        if step == 5:
            break
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
