"""Incident: micro-batches are packed per rank from the rank's own token counts
("data-dependent loop length"). At step 2 rank 0's batch has more tokens than its budget,
so rank 0 runs 3 micro-batches (3 gradient all_reduces) while rank 1 runs 2 and goes on to
the next step, whose first collective is an all_gather of sequence lengths. Rank 0's extra
all_reduce meets rank 1's all_gather at the same sequence number: the job hangs.
torchrun, 2 ranks, DataLoader with 2 persistent workers, phases/steps instrumented.
"""
LAUNCH = "torchrun"
NPROC = 2
EXPECT = {"kind": "collective-mismatch", "culprit_ranks": [0], "cause": None}

import datetime
import math
import os
import subprocess
import threading
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

from hangtrace import tracer

TOKEN_BUDGET = 64


class PackedDataset(Dataset):
    """Each item is a sequence with a length; rank 0's 2nd batch is long."""

    def __init__(self, rank, n=64):
        self.rank = rank
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        length = 16
        if self.rank == 0 and 4 <= i < 8:      # batch index 1 -> training step 2
            length = 20                        # 4 * 20 = 80 tokens > budget 64 -> 3 micro-batches
        return torch.randn(8), torch.tensor(length)


def logger_thread(rank, stop):
    while not stop.wait(2.0):
        print(f"[log] rank {rank} alive", flush=True)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"rank {rank} pid {os.getpid()} up", flush=True)
    subprocess.run(["python", "-c", "import sys; print(sys.version.split()[0])"], capture_output=True)
    stop = threading.Event()
    threading.Thread(target=logger_thread, args=(rank, stop), daemon=True).start()

    model = torch.nn.Linear(8, 1)
    loader = DataLoader(PackedDataset(rank), batch_size=4, num_workers=2, persistent_workers=True)
    it = iter(loader)
    for step in range(1, 7):
        tracer.step(step)
        x, lengths = next(it)
        with tracer.phase("pack"):
            seq_lens = [torch.zeros(1, dtype=torch.long) for _ in range(world)]
            dist.all_gather(seq_lens, lengths.sum().view(1))
            local_tokens = int(lengths.sum())
            n_micro = math.ceil(local_tokens / (TOKEN_BUDGET // 2))   # from the LOCAL view only
        with tracer.phase("train"):
            for mb in range(n_micro):
                model.zero_grad()
                model(x).pow(2).mean().backward()
                g = torch.cat([p.grad.flatten() for p in model.parameters()])
                dist.all_reduce(g)
            print(f"rank {rank} step {step} done ({n_micro} micro-batches)", flush=True)
        time.sleep(0.1)
    stop.set()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
