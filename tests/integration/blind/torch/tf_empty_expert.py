"""Incident (transformers PR 48237, variant a): MoE with expert parallelism over 3 ranks.
The expert-to-rank sharding gives rank 2 zero local experts after a resize, and at step 2
its expert forward does torch.cat() over an empty list of expert outputs and raises; rank 2
dies while ranks 0 and 1 wait in the token-combine all_to_all. torchrun, 3 ranks, DataLoader
with 2 persistent workers; uninstrumented.
"""
LAUNCH = "torchrun"
NPROC = 3
EXPECT = {"kind": "dead-rank", "culprit_ranks": [2], "cause": "exception"}

import datetime
import os
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

HID = 8
NUM_EXPERTS = 4


class Batches(Dataset):
    def __len__(self):
        return 60

    def __getitem__(self, i):
        return torch.randn(HID)


def shard_experts(rank, world, num_experts, resized):
    # contiguous expert sharding; after the "resize" the expert count no longer divides
    # the EP size and the last rank's shard comes out empty
    if resized:
        num_experts = world - 1
    per = max(1, num_experts // world)
    start = rank * per
    return list(range(start, min(start + per, num_experts)))


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"rank {rank} pid {os.getpid()} up", flush=True)
    experts = torch.nn.ModuleList([torch.nn.Linear(HID, HID) for _ in range(NUM_EXPERTS)])
    loader = DataLoader(Batches(), batch_size=world * 2, num_workers=2, persistent_workers=True)
    for step, x in enumerate(loader, start=1):
        # dispatch: every rank sends 2 tokens to each rank
        recv = torch.empty_like(x)
        dist.all_to_all_single(recv, x.contiguous())
        local = shard_experts(rank, world, NUM_EXPERTS, resized=step >= 2)
        outs = [experts[e](recv) for e in local]
        y = torch.cat(outs).view(len(local), *recv.shape).mean(0)   # raises on the empty list
        back = torch.empty_like(y)
        dist.all_to_all_single(back, y.contiguous())                 # combine
        g = back.sum().detach().view(1)
        dist.all_reduce(g)
        print(f"rank {rank} step {step} local_experts={local} g={g.item():.3f}", flush=True)
        time.sleep(0.2)
        if step == 5:
            break
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
