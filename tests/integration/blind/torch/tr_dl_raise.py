"""Incident: a corrupt shard gives rank 1 a malformed batch at step 3; the shape check in
the training loop raises ValueError("bad batch shape ...") uncaught and rank 1 exits,
while rank 0 is already waiting in the gradient all_reduce of step 3. torchrun then tears
the job down. torchrun, 2 ranks, DataLoader with 2 persistent workers, a metrics thread;
not instrumented with hangtrace phases.
"""
LAUNCH = "torchrun"
NPROC = 2
EXPECT = {"kind": "dead-rank", "culprit_ranks": [1], "cause": "exception"}

import datetime
import os
import subprocess
import threading
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset


class ShardDataset(Dataset):
    def __init__(self, rank, n=128):
        self.rank, self.n = rank, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        dim = 16
        if self.rank == 1 and 16 <= i < 24:   # third batch of rank 1 is corrupt
            dim = 15
        return torch.randn(dim), torch.randn(1)


def metrics(rank, stop):
    while not stop.wait(1.0):
        print(f"[metrics] rank {rank} rss_ok", flush=True)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"rank {rank} pid {os.getpid()} up", flush=True)
    subprocess.run(["df", "-h", "/tmp"], capture_output=True)
    stop = threading.Event()
    threading.Thread(target=metrics, args=(rank, stop), daemon=True).start()

    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(ShardDataset(rank), batch_size=8, num_workers=2, persistent_workers=True)
    for step, (x, y) in enumerate(loader, start=1):
        if x.shape[1] != 16:
            raise ValueError(f"bad batch shape {tuple(x.shape)} at step {step}: expected (8, 16)")
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
        time.sleep(0.3)
        if step == 8:
            break
    stop.set()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
