"""Incident (CPU contention on one rank, written blind 2026-12-07): a 4-rank DDP job trains a
tabular MLP on CPU. The ranks pin themselves to a core for "NUMA locality" only when a
config flag says so; from step 20 rank 2 (the rank that owns the node's scratch disk)
starts compressing the previous epoch's shard files in the background, with two
`python -c ...zlib...` worker processes, and pins itself to core 1 first
(os.sched_setaffinity). Its children inherit that affinity, so the two compressors and
rank 2 now share one core: rank 2 gets about a third of it. Nothing fails or hangs; the
whole job slows to rank 2's pace because the others wait for its gradients in DDP's
all-reduce. (The compressors stop by themselves when rank 2 exits.)

torchrun, 4 ranks, gloo, DDP, DataLoader(num_workers=2, persistent_workers=True). No
hangtrace phase API: the user changed nothing in the script.

Expected: progressing, rank 2 named as the straggler (since about step 20; not checked:
the script marks no steps).
"""
LAUNCH = "torchrun"
NPROC = 4
STEPS = 80
DUMP_AT_STEP = 35
EXPECT = {"straggler": 2, "since_step": None, "min_added_pct": 30}

import datetime
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def say(msg, **_):
    sys.stdout.write(msg + "\n")  # one write: ranks share the console
    sys.stdout.flush()


BATCH = 128
FEATURES = 96
SCRATCH_RANK = 2
COMPRESS_FROM = 20

COMPRESSOR = r"""
import os, sys, zlib
parent = os.getppid()
blob = os.urandom(1 << 20)
n = 0
while os.getppid() == parent:          # the shard compressor: until its rank goes away
    zlib.compress(blob, 9)
    n += 1
"""


def start_compressors():
    # "for locality": the rank and its helpers on the core next to the scratch disk's IRQs
    os.sched_setaffinity(0, {1})
    return [subprocess.Popen([sys.executable, "-c", COMPRESSOR]) for _ in range(2)]


def make_dataset(n):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(n, FEATURES, generator=g)
    w = torch.randn(FEATURES, 1, generator=g)
    y = (x @ w > 0).float().squeeze(1)
    return TensorDataset(x, y)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(
        nn.Linear(FEATURES, 512), nn.ReLU(),
        nn.Linear(512, 512), nn.ReLU(),
        nn.Linear(512, 512), nn.ReLU(),
        nn.Linear(512, 1)))
    opt = torch.optim.Adam(model.parameters(), lr=3e-4)
    ds = make_dataset(STEPS * BATCH * world)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True)
    loader = DataLoader(ds, batch_size=BATCH, sampler=sampler, num_workers=2,
                        persistent_workers=True, drop_last=True)

    compressors = []
    timing = []  # (step, data_ms, bwd_ms incl. DDP sync, step_ms, fwd_ms)
    it = iter(loader)
    for step in range(STEPS):
        if rank == SCRATCH_RANK and step == COMPRESS_FROM:
            compressors = start_compressors()
        t0 = time.perf_counter()
        x, y = next(it)
        t1 = time.perf_counter()
        loss = nn.functional.binary_cross_entropy_with_logits(model(x).squeeze(1), y)
        tf = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        t2 = time.perf_counter()
        timing.append((step, (t1 - t0) * 1e3, (t2 - tf) * 1e3, (t2 - t0) * 1e3, (tf - t1) * 1e3))
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f} ({(t2 - t0) * 1e3:.0f} ms)", flush=True)

    # this rank's own compute time, measured alone afterwards on the same core set: shows
    # what the contention did to it (the fwd+bwd above includes waiting for the others)
    xb, yb = ds[:BATCH]
    solo = []
    with model.no_sync():
        for _ in range(5):
            t = time.perf_counter()
            nn.functional.binary_cross_entropy_with_logits(model(xb).squeeze(1), yb).backward()
            solo.append((time.perf_counter() - t) * 1e3)
    for name, rows in (("before", [r for r in timing if 3 <= r[0] < COMPRESS_FROM]),
                       ("after", [r for r in timing if r[0] >= COMPRESS_FROM + 2])):
        say(f"TIMING rank {rank} steps {name} step {COMPRESS_FROM}: median step "
              f"{statistics.median(r[3] for r in rows):.1f} ms, forward "
              f"{statistics.median(r[4] for r in rows):.1f} ms, bwd+DDP sync "
              f"{statistics.median(r[2] for r in rows):.1f} ms, data "
              f"{statistics.median(r[1] for r in rows):.1f} ms (n={len(rows)})", flush=True)
    say(f"TIMING rank {rank} after the loop, its fwd+bwd without sync (all ranks at once): "
          f"{statistics.median(solo):.1f} ms; affinity {sorted(os.sched_getaffinity(0))}", flush=True)
    dist.barrier()
    for p in compressors:
        p.terminate()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
