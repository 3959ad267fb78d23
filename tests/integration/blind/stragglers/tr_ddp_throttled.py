"""Incident (thermal throttling, written blind 2026-12-07): a 4-rank DDP job fine-tunes a
classification head on a frozen encoder (linear probing); the encoder's forward is most of
each step's compute. From step 20 the GPU of rank 2 runs hot and its clocks drop: every
kernel takes about 4x as long. There is no GPU here, so the stand-in is that rank 2 runs
its encoder's matmuls 4 times from step 20 (same result, 4x the work). Nothing fails and
nothing hangs: every rank's step simply becomes as slow as rank 2, because the others wait
for its gradients in DDP's all-reduce. The user sees "the job got 2x slower at step 20"
and wants to know which rank to drain.

torchrun, 4 ranks, gloo, DDP, DataLoader(num_workers=2, persistent_workers=True) with a
DistributedSampler; marks its steps and phases with the hangtrace phase API
(tracer.step, tracer.phase("data") / ("train")).

Expected: progressing, rank 2 named as the straggler, since about step 20.
"""
LAUNCH = "torchrun"
NPROC = 4
STEPS = 80
DUMP_AT_STEP = 35          # the runner's mid-run `hangtrace dump` (after the slowdown began)
EXPECT = {"straggler": 2, "since_step": (18, 25), "min_added_pct": 30}

import datetime
import logging
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


BATCH = 64
DIM = 512
THROTTLED_RANK = 2
THROTTLE_FROM = 20
THROTTLE_FACTOR = 4

log = logging.getLogger("probe")


class FrozenEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(DIM, DIM) for _ in range(8))
        for p in self.parameters():
            p.requires_grad_(False)

    @torch.no_grad()
    def forward(self, x, passes=1):
        out = None
        for _ in range(passes):  # a throttled device: each kernel takes `passes` times as long
            h = x
            for lin in self.layers:
                h = torch.tanh(lin(h))
            out = h
        return out


def make_dataset(n):
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(n, DIM, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    return TensorDataset(x, y)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s [rank {rank}] %(message)s")
    torch.manual_seed(0)

    encoder = FrozenEncoder()
    encoder.eval()
    head = DDP(nn.Sequential(nn.Linear(DIM, 128), nn.ReLU(), nn.Linear(128, 10)))
    opt = torch.optim.AdamW(head.parameters(), lr=1e-3)

    ds = make_dataset(STEPS * BATCH * world)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=BATCH, sampler=sampler, num_workers=2,
                        persistent_workers=True, drop_last=True)
    it = iter(loader)

    timing = []  # per step: (step, data_ms, encoder_ms, head_and_sync_ms, step_ms)
    for step in range(STEPS):
        tracer.step(step)
        t0 = time.perf_counter()
        with tracer.phase("data"):
            x, y = next(it)
        t1 = time.perf_counter()
        with tracer.phase("train"):
            passes = THROTTLE_FACTOR if (rank == THROTTLED_RANK and step >= THROTTLE_FROM) else 1
            feats = encoder(x, passes=passes)
            t2 = time.perf_counter()
            loss = nn.functional.cross_entropy(head(feats), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()  # DDP all-reduces the head's gradients here
            opt.step()
        t3 = time.perf_counter()
        timing.append((step, (t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3, (t3 - t0) * 1e3))
        if rank == 0:
            log.info("step %d loss %.4f (%.0f ms)", step, loss.item(), (t3 - t0) * 1e3)

    def med(rows, i):
        return statistics.median(r[i] for r in rows)

    for name, rows in (("before", [r for r in timing if 3 <= r[0] < THROTTLE_FROM]),
                       ("after", [r for r in timing if r[0] >= THROTTLE_FROM + 2])):
        say(f"TIMING rank {rank} steps {name} step {THROTTLE_FROM}: median step {med(rows, 4):.1f} ms, "
              f"encoder {med(rows, 2):.1f} ms, head+DDP sync {med(rows, 3):.1f} ms, "
              f"data {med(rows, 1):.1f} ms (n={len(rows)})", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
