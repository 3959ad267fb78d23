"""Toy DDP job: rank 1 checkpoints to a 'network mount' that hangs (a FIFO nobody reads).

Written blind on 2026-12-04 by a helper that had read only the README (helper 49), from
the incident: "We launch with torch.multiprocessing.spawn from a launcher script; our
cluster wrapper sets RANK=0, WORLD_SIZE=2, MASTER_ADDR, MASTER_PORT in the launcher's own
environment (the spawned children inherit RANK=0 too). 2 ranks, gloo, DDP, DataLoader
with num_workers=2. Every 4 steps rank 1 saves a checkpoint with torch.save to a network
mount that hung (a FIFO nobody reads); rank 0 waits in dist.barrier()." Its verdict was
right. For the corpus: the FIFO's folder and the port come from the launcher (a temp
folder, a free port) instead of fixed ones.
"""
LAUNCH = "python"
NPROC = 2
EXPECT = {"kind": "stuck-outside-collective", "culprit_ranks": [1],
          "says": ["openat(", "wait_for_partner", "barrier"]}

import os
import socket
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

from hangtrace import tracer

CKPT_DIR = os.environ.get("BLIND_CKPT_DIR", "/tmp/blind5_ckpt/nfs_ckpt")   # stands in for the hung network mount
CKPT_EVERY = 4
WORLD = 2


class RandomRegression(Dataset):
    def __init__(self, n=2048):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 32, generator=g)
        self.y = self.x @ torch.randn(32, 1, generator=g) + 0.1 * torch.randn(n, 1, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def log(rank, msg):
    print(f"[{time.strftime('%H:%M:%S')}] rank {rank}: {msg}", flush=True)


def train(i):
    # spawn index is the rank; RANK=0 is inherited from the cluster wrapper's env
    dist.init_process_group("gloo", rank=i, world_size=WORLD)
    rank = dist.get_rank()
    torch.manual_seed(1234)
    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.MSELoss()
    ds = RandomRegression()
    sampler = DistributedSampler(ds, num_replicas=WORLD, rank=rank, shuffle=True)
    loader = DataLoader(ds, batch_size=32, sampler=sampler, num_workers=2)

    step = 0
    for epoch in range(100):
        sampler.set_epoch(epoch)
        for x, y in loader:
            tracer.step(step)
            with tracer.phase("train"):
                opt.zero_grad()
                loss = loss_fn(model(x), y)
                loss.backward()
                opt.step()
            if step % 2 == 0:
                log(rank, f"step {step} loss {loss.item():.4f}")
            if (step + 1) % CKPT_EVERY == 0:
                with tracer.phase("checkpoint"):
                    if rank == 1:
                        os.makedirs(CKPT_DIR, exist_ok=True)
                        path = os.path.join(CKPT_DIR, "latest.pt")
                        if not os.path.exists(path):
                            os.mkfifo(path)   # the mount that hung: open() never returns
                        state = {"model": model.module.state_dict(),
                                 "opt": opt.state_dict(), "step": step}
                        log(rank, f"HANG-START saving checkpoint to {path}")
                        torch.save(state, path)
                        log(rank, "checkpoint saved")
                    dist.barrier()
            step += 1
            time.sleep(0.05)
    dist.destroy_process_group()


if __name__ == "__main__":
    # what the cluster wrapper does in the launcher's own environment
    os.environ["RANK"] = "0"
    os.environ["WORLD_SIZE"] = str(WORLD)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    os.environ["BLIND_CKPT_DIR"] = tempfile.mkdtemp(prefix="blind-ckpt-")
    mp.spawn(train, nprocs=WORLD)
