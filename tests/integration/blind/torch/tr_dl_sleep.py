"""Incident: rank 1's augmentation/prefetch thread dies (KeyError in a transform) at step 3.
The main loop of rank 1 then waits on the prefetch queue that nobody will ever fill again,
outside any collective, while rank 0 has already entered the next gradient all_reduce.
Looks like an "NCCL timeout" from rank 0's side; the real culprit is the CPU-side wait
on rank 1.  torchrun, 2 ranks, DataLoader with 2 persistent workers, a metrics thread.
"""
LAUNCH = "torchrun"
NPROC = 2
EXPECT = {"kind": "stuck-outside-collective", "culprit_ranks": [1], "cause": None}

import datetime
import os
import queue
import subprocess
import sys
import threading
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset


class ToyDataset(Dataset):
    def __init__(self, n=256, dim=16):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, dim, generator=g)
        self.y = torch.randn(n, 1, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def metrics_thread(rank, state, stop):
    while not stop.wait(1.0):
        print(f"[metrics] rank {rank} step={state['step']} loss={state['loss']:.4f}", flush=True)


def prefetcher(rank, loader_iter, q, fail_at):
    # augments batches in the background and hands them to the train loop
    n = 0
    for x, y in loader_iter:
        n += 1
        if rank == 1 and n == fail_at:
            aug = {"flip": 1}
            x = x * aug["mixup"]          # KeyError: thread dies, queue never gets this batch
        q.put((x, y))
    q.put(None)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"rank {rank} pid {os.getpid()} up", flush=True)
    subprocess.run(["uname", "-r"], check=False, capture_output=True)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(ToyDataset(), batch_size=8, num_workers=2, persistent_workers=True, shuffle=False)

    state = {"step": 0, "loss": 0.0}
    stop = threading.Event()
    threading.Thread(target=metrics_thread, args=(rank, state, stop), daemon=True, name="metrics").start()

    q = queue.Queue(maxsize=2)
    threading.Thread(target=prefetcher, args=(rank, iter(loader), q, 3), daemon=True, name="prefetch").start()

    for step in range(1, 9):
        state["step"] = step
        item = q.get(timeout=170)          # rank 1 blocks here at step 3
        if item is None:
            break
        x, y = item
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        opt.step()
        state["loss"] = loss.item()
        print(f"rank {rank} step {step} done loss {loss.item():.4f}", flush=True)
        time.sleep(0.2)
    stop.set()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
