"""Incident: a hand-rolled launcher (multiprocessing.Process, "spawn" start method) sets
RANK/WORLD_SIZE/MASTER_* in the parent's environment before starting each child. At step 2
rank 0's training function raises ValueError (a config value parsed from a bad string) and
its process exits 1; rank 1 is left in the gradient all_reduce. Rank 0 also hosts the
TCPStore, so rank 1 may fail with a connection error right after: that is cascade.
Uninstrumented.
"""
LAUNCH = "mp"
NPROC = 2
EXPECT = {"kind": "dead-rank", "culprit_ranks": [0], "cause": "exception"}

import datetime
import multiprocessing
import os
import socket
import sys
import time


def train(world):
    import torch
    import torch.distributed as dist
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    print(f"rank {rank} pid {os.getpid()} up", flush=True)
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    schedule = {1: "0.05", 2: "0.05x", 3: "0.04"}   # a typo in the LR schedule
    for step in range(1, 6):
        x = torch.randn(4, 8)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        if rank == 0:
            # only rank 0 reads the schedule (it "owns" logging and the LR table)
            lr = float(schedule.get(step, "0.03"))
            for g in opt.param_groups:
                g["lr"] = lr
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
        time.sleep(0.2)
    dist.destroy_process_group()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


if __name__ == "__main__":
    ctx = multiprocessing.get_context("spawn")
    os.environ["WORLD_SIZE"] = str(NPROC)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(free_port())
    procs = []
    for r in range(NPROC):
        os.environ["RANK"] = str(r)
        os.environ["LOCAL_RANK"] = str(r)
        p = ctx.Process(target=train, args=(NPROC,), name=f"rank{r}")
        p.start()
        procs.append(p)
    rc = 0
    for p in procs:
        p.join()
        print(f"{p.name} exited with {p.exitcode}", flush=True)
        if p.exitcode and not rc:
            rc = p.exitcode if p.exitcode > 0 else 128 - p.exitcode
    sys.exit(rc)
