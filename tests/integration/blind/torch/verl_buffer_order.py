"""Incident (verl #6365): after the model is wrapped, the order of its buffers differs across
ranks, and the "sync model states from rank 0" loop broadcasts buffers in that local order.
Rank 0 broadcasts [a (4 elems), b (1024 elems)]; rank 1 posts [b, a]: buffers of different
sizes are broadcast against each other at model load (on gloo: a size-mismatch abort in a
later broadcast, or a silent short read). torch.multiprocessing.spawn launcher; the parent
sets RANK/WORLD_SIZE/MASTER_*; uninstrumented.
"""
LAUNCH = "spawn"
NPROC = 2
EXPECT = {"kind": "collective-mismatch", "culprit_ranks": [0, 1], "cause": None}

import datetime
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


class Policy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)
        self.register_buffer("a", torch.zeros(4))          # e.g. a small running statistic
        self.register_buffer("b", torch.zeros(1024))       # e.g. a rotary/position table


def wrapped_buffers(model, rank):
    bufs = list(model.named_buffers())
    if rank != 0:
        # the wrapper on this rank collected buffers through a dict keyed by storage size
        # (different insertion order after wrapping) -> local order [b, a]
        bufs = sorted(bufs, key=lambda kv: -kv[1].numel())
    return bufs


def worker(local_rank, world):
    dist.init_process_group("gloo", rank=local_rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    rank = dist.get_rank()
    print(f"rank {rank} pid {os.getpid()} up", flush=True)
    model = Policy()
    if rank == 0:
        model.a.fill_(1.0)
        model.b.fill_(2.0)
    for name, buf in wrapped_buffers(model, rank):
        print(f"rank {rank} broadcasting buffer {name} numel={buf.numel()}", flush=True)
        dist.broadcast(buf, src=0)
    print(f"rank {rank} model states synced", flush=True)
    for step in range(1, 4):
        g = torch.ones(4)
        dist.all_reduce(g)
        print(f"rank {rank} step {step}", flush=True)
        time.sleep(0.2)
    dist.destroy_process_group()


def free_port():
    s = socket.socket()
    s.bind(("", 0))
    p = s.getsockname()[1]
    s.close()
    return p


if __name__ == "__main__":
    os.environ["RANK"] = "0"
    os.environ["WORLD_SIZE"] = str(NPROC)
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = str(free_port())
    mp.spawn(worker, args=(NPROC,), nprocs=NPROC)
