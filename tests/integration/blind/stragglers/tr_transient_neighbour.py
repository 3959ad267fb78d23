"""Incident (a transient noisy neighbour, written blind 2026-12-07): a 4-rank DDP job; the
device of rank 3 is shared (MPS / time-slicing) with another tenant's batch job, which runs
a burst of kernels during steps 20-30 and then finishes. While it runs, every kernel of
rank 3 takes about 5x as long (stand-in here: rank 3 runs its forward 5 times in steps
20-30); from step 31 on rank 3 is as fast as the others again, until the end (step 79).
Nothing fails or hangs.

What a user should be told, mid-run long after the burst (the runner dumps at step 55) and
after the run (`hangtrace analyze`): NOT "rank 3 is slow (since step 20)". That sentence is
about the present, and at both moments rank 3 has been as fast as its peers for 25-50 steps:
a user who reads it drains or restarts a healthy node. Correct: no current straggler
("straggler" key absent). A verdict that names the episode as over (rank 3 was slow in steps
20-30; a `until_step` in 28-34 beside `since_step`) is right too: it is true and useful
history. Naming rank 3 with no end is wrong.

torchrun, 4 ranks, gloo, DDP, DataLoader(num_workers=2, persistent_workers=True); steps
and phases marked with the hangtrace phase API ("data", "train").
"""
LAUNCH = "torchrun"
NPROC = 4
STEPS = 80
DUMP_AT_STEP = 55
EXPECT = {"straggler": None, "since_step": None, "min_added_pct": None, "ended_ok": (3, (28, 34))}

import datetime
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from hangtrace import tracer


def say(msg, **_):
    sys.stdout.write(msg + "\n")  # one write: ranks share the console
    sys.stdout.flush()


BATCH = 192
DIM = 448
SHARED_RANK = 3
BURST = range(20, 31)   # steps 20-30


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(*[nn.Sequential(nn.Linear(DIM, DIM), nn.GELU()) for _ in range(4)])
        self.head = nn.Linear(DIM, 1)

    def forward(self, x, contended=False):
        if contended:  # the neighbour's kernels interleave with ours: each of ours waits
            with torch.no_grad():
                for _ in range(4):
                    self.body(x)
        return self.head(self.body(x))


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(Net())
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(5)
    x_all = torch.randn(STEPS * BATCH * world, DIM, generator=g)
    ds = TensorDataset(x_all, x_all[:, :1].clone())
    loader = DataLoader(ds, batch_size=BATCH, sampler=DistributedSampler(ds, shuffle=False),
                        num_workers=2, persistent_workers=True, drop_last=True)
    it = iter(loader)
    rows = []  # (step, fwd_ms, bwd_sync_ms, step_ms)
    for step in range(STEPS):
        tracer.step(step)
        t0 = time.perf_counter()
        with tracer.phase("data"):
            x, y = next(it)
        with tracer.phase("train"):
            t1 = time.perf_counter()
            out = model(x, contended=(rank == SHARED_RANK and step in BURST))
            loss = nn.functional.mse_loss(out, y)
            t2 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        t3 = time.perf_counter()
        rows.append((step, (t2 - t1) * 1e3, (t3 - t2) * 1e3, (t3 - t0) * 1e3))
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f} ({(t3 - t0) * 1e3:.0f} ms)", flush=True)

    for name, sel in (("3-19", [r for r in rows if 3 <= r[0] < 20]),
                      ("21-30 (burst)", [r for r in rows if 21 <= r[0] <= 30]),
                      ("33-79", [r for r in rows if r[0] >= 33])):
        med = lambda i: statistics.median(r[i] for r in sel)
        say(f"TIMING rank {rank} steps {name}: median step {med(3):.1f} ms, forward {med(1):.1f} ms, "
              f"bwd+DDP sync {med(2):.1f} ms (n={len(sel)})", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
