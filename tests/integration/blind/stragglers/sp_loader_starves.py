"""Incident (a rank whose data loader starves, written blind 2026-12-07): 4 ranks train a
small regression model with explicit gradient all-reduces (no DDP). Each rank reads its
own shard through a Dataset whose __getitem__ fetches the sample from object storage
behind a local cache. Rank 1's cache fills up at step 10: from then on every sample of
rank 1 is fetched remotely (about 20 ms each, a sleep here), in its 2 DataLoader workers.
Its workers can no longer keep up, rank 1 waits for batches in `next(loader)`, and the
other ranks wait for it in the gradient all-reduce. Nothing fails or hangs; the job runs
about 2x slower.

torch.multiprocessing.spawn, started by a wrapper whose own environment has RANK=0 and
WORLD_SIZE/MASTER_* (every child inherits RANK=0 and gets its rank as the spawn index);
DataLoader(num_workers=2, persistent_workers=True, multiprocessing_context="fork");
steps and phases marked with the hangtrace phase API ("data", "compute", "allreduce").

Expected: progressing, rank 1 named as the straggler since about step 10 (its workers
prefetch, so the first starved batch is a little later; 9-16 accepted).
"""
LAUNCH = "spawn"
NPROC = 4
STEPS = 80
DUMP_AT_STEP = 28
EXPECT = {"straggler": 1, "since_step": (9, 16), "min_added_pct": 30}

import datetime
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

from hangtrace import tracer


def say(msg, **_):
    sys.stdout.write(msg + "\n")  # one write: ranks share the console
    sys.stdout.flush()


BATCH = 16
FEATURES = 64
CACHE_FULL_AT_STEP = 10
REMOTE_FETCH_S = 0.020


class ShardDataset(Dataset):
    def __init__(self, rank, n):
        self.rank = rank
        g = torch.Generator().manual_seed(100 + rank)
        self.x = torch.randn(n, FEATURES, generator=g)
        self.y = self.x[:, :4].sum(1, keepdim=True) + 0.1 * torch.randn(n, 1, generator=g)

    def __len__(self):
        return len(self.x)

    def _cached(self, i):
        # rank 1's local cache holds only its first CACHE_FULL_AT_STEP batches
        return self.rank != 1 or i < CACHE_FULL_AT_STEP * BATCH

    def __getitem__(self, i):
        if not self._cached(i):
            time.sleep(REMOTE_FETCH_S)  # remote object-store GET
        return self.x[i], self.y[i]


def worker(rank, world):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, 384), nn.ReLU(), nn.Linear(384, 384), nn.ReLU(),
                          nn.Linear(384, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    # fork: under mp.spawn the workers would be spawned too, and re-import torch (~50 s here)
    loader = DataLoader(ShardDataset(rank, STEPS * BATCH), batch_size=BATCH, shuffle=False,
                        num_workers=2, persistent_workers=True, multiprocessing_context="fork")
    it = iter(loader)
    rows = []  # (step, data_ms, compute_ms, allreduce_ms, step_ms)
    for step in range(STEPS):
        tracer.step(step)
        t0 = time.perf_counter()
        with tracer.phase("data"):
            x, y = next(it)
        t1 = time.perf_counter()
        with tracer.phase("compute"):
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
        t2 = time.perf_counter()
        with tracer.phase("allreduce"):
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world
        t3 = time.perf_counter()
        opt.step()
        t4 = time.perf_counter()
        rows.append((step, (t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3, (t4 - t0) * 1e3))
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f} ({(t4 - t0) * 1e3:.0f} ms)", flush=True)

    for name, sel in (("before", [r for r in rows if 2 <= r[0] < CACHE_FULL_AT_STEP]),
                      ("after", [r for r in rows if r[0] >= CACHE_FULL_AT_STEP + 4])):
        med = lambda i: statistics.median(r[i] for r in sel)
        say(f"TIMING rank {rank} steps {name} step {CACHE_FULL_AT_STEP}: median step {med(4):.1f} ms, "
              f"data wait {med(1):.1f} ms, compute {med(2):.1f} ms, all_reduce {med(3):.1f} ms "
              f"(n={len(sel)})", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    # the cluster wrapper exports these for the node, RANK included
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE=str(NPROC), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    print(f"spawning {NPROC} ranks, master port {port}", flush=True)
    mp.spawn(worker, args=(NPROC,), nprocs=NPROC, join=True)
