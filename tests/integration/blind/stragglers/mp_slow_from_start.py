"""Incident (a rank slow from the first step, written blind 2026-12-07): a 2-rank job on a
mixed pool of machines; rank 1 lands on an older node whose CPU is about 1.5x slower for
this model. The stand-in here: rank 1 does 1.5x the work of each step (its model's hidden
blocks are applied 9 times where rank 0 applies them 6 times; same result shape). Rank 1
is slower from step 0, so no "before" exists to compare it with: only its peer. Rank 0
waits for it in every gradient all-reduce. Nothing fails or hangs.

Plain multiprocessing (the parent sets RANK, WORLD_SIZE and MASTER_* in os.environ before
starting each Process; default start method), explicit all_reduce of gradients, no
DataLoader, no hangtrace phase API.

Expected: progressing, rank 1 named as the straggler; since_step 0 or null (the script
marks no steps: its slowness has no start inside the run).
"""
LAUNCH = "multiprocessing"
NPROC = 2
STEPS = 70
DUMP_AT_STEP = 15
EXPECT = {"straggler": 1, "since_step": (0, 3), "since_step_null_ok": True, "min_added_pct": 20}

import datetime
import multiprocessing
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn


def say(msg, **_):
    sys.stdout.write(msg + "\n")  # one write: ranks share the console
    sys.stdout.flush()


BATCH = 128
DIM = 384
NODE_SLOWNESS = {0: 1.0, 1: 1.5}  # what the node's CPU costs this model, relative to rank 0


class Model(nn.Module):
    def __init__(self, repeats):
        super().__init__()
        self.inp = nn.Linear(32, DIM)
        self.block = nn.Linear(DIM, DIM)
        self.out = nn.Linear(DIM, 1)
        self.repeats = repeats

    def forward(self, x):
        h = torch.relu(self.inp(x))
        for _ in range(self.repeats):       # the "slower node": more passes, same shapes
            h = torch.tanh(self.block(h)) * 0.5 + h * 0.5
        return self.out(h)


def train():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    torch.manual_seed(0)
    model = Model(repeats=int(6 * NODE_SLOWNESS[rank]))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(rank)
    rows = []  # (step, compute_ms, allreduce_ms, step_ms)
    for step in range(STEPS):
        t0 = time.perf_counter()
        x = torch.randn(BATCH, 32, generator=g)
        y = x[:, :3].sum(1, keepdim=True)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        t1 = time.perf_counter()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        rows.append((step, (t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t0) * 1e3))
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f} ({(t3 - t0) * 1e3:.0f} ms)", flush=True)
    rows = rows[2:]
    say(f"TIMING rank {rank} steps 2-{STEPS - 1}: median step {statistics.median(r[3] for r in rows):.1f} ms, "
          f"compute {statistics.median(r[1] for r in rows):.1f} ms, "
          f"all_reduce {statistics.median(r[2] for r in rows):.1f} ms", flush=True)
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    os.environ.update(WORLD_SIZE=str(NPROC), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    procs = []
    for r in range(NPROC):
        os.environ["RANK"] = os.environ["LOCAL_RANK"] = str(r)
        p = multiprocessing.Process(target=train, name=f"rank{r}")
        p.start()
        procs.append(p)
    rc = 0
    for p in procs:
        p.join()
        if p.exitcode and not rc:
            rc = p.exitcode if p.exitcode > 0 else 128 - p.exitcode
    sys.exit(rc)
