"""Incident (no incident: healthy noise, written blind 2026-12-07): a 4-rank DDP job trains a
small token classifier; batches are padded to a length drawn per batch (dynamic padding of
variable-length documents), so every rank's compute per step varies by about +-20 % at
random, independently on every rank. Each step waits for whichever rank drew the longest
batch, and that rank changes from step to step. A user who looks at the job sees uneven
step times but no rank that is slower than the others: no rank should be named.

torchrun, 4 ranks, gloo, DDP, DataLoader(num_workers=2, persistent_workers=True) whose
collate_fn pads each batch; steps and phases marked with the hangtrace phase API.

Expected: progressing, no straggler (details has no "straggler" key).
"""
LAUNCH = "torchrun"
NPROC = 4
STEPS = 80
DUMP_AT_STEP = 40
EXPECT = {"straggler": None, "since_step": None, "min_added_pct": None}

import datetime
import random
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from hangtrace import tracer


def say(msg, **_):
    sys.stdout.write(msg + "\n")  # one write: ranks share the console
    sys.stdout.flush()


BATCH = 32
MEAN_LEN = 64
VOCAB = 1000
DIM = 64


class Docs(Dataset):
    """Tokenised documents, longer than any batch length; a label per document."""

    def __init__(self, n):
        g = torch.Generator().manual_seed(3)
        self.tokens = torch.randint(1, VOCAB, (n, int(MEAN_LEN * 1.25)), generator=g)
        self.labels = (self.tokens[:, :8].sum(1) % 4)

    def __len__(self):
        return len(self.tokens)

    def __getitem__(self, i):
        return self.tokens[i], self.labels[i]


class PadToBatchLength:
    """Dynamic padding: a batch is cut to its own length, between 0.8 and 1.2 x the mean."""

    def __init__(self, rank):
        self.rank = rank

    def __call__(self, items):
        toks = torch.stack([t for t, _ in items])
        labels = torch.stack([y for _, y in items])
        rng = random.Random(hash((self.rank, int(toks[0, 0]), int(toks[-1, 1]))))
        length = int(round(MEAN_LEN * rng.uniform(0.8, 1.2)))
        return toks[:, :length], labels


class TokenClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(),
                                 nn.Linear(256, DIM))
        self.out = nn.Linear(DIM, 4)

    def forward(self, toks):
        h = self.mlp(self.emb(toks))
        return self.out(h.mean(1))


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(TokenClassifier())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ds = Docs(STEPS * BATCH * world)
    loader = DataLoader(ds, batch_size=BATCH, sampler=DistributedSampler(ds, shuffle=True, seed=1),
                        num_workers=2, persistent_workers=True, drop_last=True,
                        collate_fn=PadToBatchLength(rank))
    it = iter(loader)
    rows = []  # (step, length, fwd_ms, bwd_sync_ms, step_ms)
    for step in range(STEPS):
        tracer.step(step)
        t0 = time.perf_counter()
        with tracer.phase("data"):
            toks, labels = next(it)
        with tracer.phase("train"):
            t1 = time.perf_counter()
            loss = nn.functional.cross_entropy(model(toks), labels)
            t2 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        t3 = time.perf_counter()
        rows.append((step, toks.shape[1], (t2 - t1) * 1e3, (t3 - t2) * 1e3, (t3 - t0) * 1e3))
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f} len {toks.shape[1]} ({(t3 - t0) * 1e3:.0f} ms)",
                  flush=True)

    rows = rows[3:]
    fwd = sorted(r[2] for r in rows)
    say(f"TIMING rank {rank} steps 3-{STEPS - 1}: median step {statistics.median(r[4] for r in rows):.1f} ms, "
          f"forward median {statistics.median(fwd):.1f} ms (p10 {fwd[len(fwd) // 10]:.1f}, "
          f"p90 {fwd[9 * len(fwd) // 10]:.1f}), bwd+DDP sync {statistics.median(r[3] for r in rows):.1f} ms, "
          f"batch length mean {statistics.mean(r[1] for r in rows):.1f} "
          f"(min {min(r[1] for r in rows)}, max {max(r[1] for r in rows)})", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
