"""Incident: a spawn-launched job (torch.multiprocessing.spawn; the parent sets RANK=0,
WORLD_SIZE, MASTER_ADDR/PORT in its env first) with a DataLoader (2 persistent workers) per
rank. At step 2 rank 0's label-remapping raises RuntimeError (an unknown class id in the
batch); spawn's wrapper reports it and the parent terminates rank 1, which was waiting in
the gradient all_reduce. A metrics thread runs in each rank; uninstrumented.
"""
LAUNCH = "spawn"
NPROC = 2
EXPECT = {"kind": "dead-rank", "culprit_ranks": [0], "cause": "exception"}

import datetime
import os
import socket
import threading
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, Dataset

LABEL_MAP = {0: 0, 1: 1, 2: 2}


class Labeled(Dataset):
    def __init__(self, rank):
        self.rank = rank

    def __len__(self):
        return 64

    def __getitem__(self, i):
        label = i % 3
        if self.rank == 0 and i == 9:          # second batch of rank 0 has class 7
            label = 7
        return torch.randn(10), label


def worker(local_rank, world):
    dist.init_process_group("gloo", rank=local_rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    rank = dist.get_rank()
    print(f"rank {rank} pid {os.getpid()} up", flush=True)
    stop = threading.Event()

    def metrics():
        while not stop.wait(1.0):
            print(f"[metrics] rank {rank} ok", flush=True)
    threading.Thread(target=metrics, daemon=True).start()

    model = torch.nn.Linear(10, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(Labeled(rank), batch_size=8, num_workers=2, persistent_workers=True)
    for step, (x, y) in enumerate(loader, start=1):
        bad = [int(v) for v in y if int(v) not in LABEL_MAP]
        if bad:
            raise RuntimeError(f"unknown class id(s) {bad} in batch at step {step}")
        y = torch.tensor([LABEL_MAP[int(v)] for v in y])
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
        time.sleep(0.2)
        if step == 5:
            break
    stop.set()
    dist.destroy_process_group()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


if __name__ == "__main__":
    os.environ["RANK"] = "0"
    os.environ["WORLD_SIZE"] = str(NPROC)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(free_port())
    mp.spawn(worker, args=(NPROC,), nprocs=NPROC, join=True)
