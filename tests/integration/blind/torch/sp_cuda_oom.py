"""Incident: a CUDA OOM on one rank ("Tried to allocate 2.00 GiB (GPU 1; 79.15 GiB total
capacity ...)") during the forward of step 2 kills rank 1 while rank 0 waits in all_reduce.
This machine has no GPU, so rank 1 raises torch.cuda.OutOfMemoryError with the real message
text itself: an honest CPU stand-in for the allocator's error.  Launched with
torch.multiprocessing.spawn; the parent sets RANK/WORLD_SIZE/MASTER_* (RANK=0 for all
children, as many scripts do) and each child passes its real rank to init_process_group.
"""
LAUNCH = "spawn"
NPROC = 2
EXPECT = {"kind": "dead-rank", "culprit_ranks": [1], "cause": "cuda-oom"}

import datetime
import os
import socket
import threading
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hangtrace import tracer


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def worker(local_rank, world):
    dist.init_process_group("gloo", rank=local_rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    rank = dist.get_rank()
    print(f"rank {rank} pid {os.getpid()} up (env RANK={os.environ.get('RANK')})", flush=True)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(1, 7):
        tracer.step(step)
        with tracer.phase("train"):
            x = torch.randn(16, 32)
            if rank == 1 and step == 2:
                # stand-in for the caching allocator failing on the activation buffer
                raise torch.cuda.OutOfMemoryError(
                    "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 1; 79.15 GiB total "
                    "capacity; 76.02 GiB already allocated; 1.21 GiB free; 77.40 GiB reserved in "
                    "total by PyTorch) If reserved memory is >> allocated memory try setting "
                    "max_split_size_mb to avoid fragmentation.")
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
            opt.step()
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
        time.sleep(0.2)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ["RANK"] = "0"
    os.environ["WORLD_SIZE"] = str(NPROC)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(free_port())
    mp.spawn(worker, args=(NPROC,), nprocs=NPROC, join=True)
