"""Incident: uneven data shards ("uneven inputs"). Rank 1's shard has 3 batches, rank 0's
has 6; each rank loops over its own loader. Rank 1 finishes its epoch after step 3, saves
nothing, destroys its process group and exits 0, while rank 0 waits in the gradient
all_reduce of step 4 for a rank that left the loop. torchrun reports rank 0's failure as the
root cause. torchrun, 2 ranks, DataLoader with 2 persistent workers, phases/steps instrumented.
"""
LAUNCH = "torchrun"
NPROC = 2
EXPECT = {"kind": "skipped-collective", "culprit_ranks": [1], "cause": None}

import datetime
import os
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

from hangtrace import tracer


class Shard(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.randn(16), torch.randn(1)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank = dist.get_rank()
    print(f"rank {rank} pid {os.getpid()} up", flush=True)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Shard(48 if rank == 0 else 24), batch_size=8, num_workers=2, persistent_workers=True)
    step = 0
    for x, y in loader:
        step += 1
        tracer.step(step)
        with tracer.phase("train"):
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
            opt.step()
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
        time.sleep(0.3)
    print(f"rank {rank} epoch done after {step} steps, exiting", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
