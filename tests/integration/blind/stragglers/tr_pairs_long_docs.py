"""Incident (one rank gets the long documents, written blind 2026-12-07): 8 ranks train 4
independent small language-model variants (a hyperparameter sweep packed into one job):
each variant is data-parallel over a pair of ranks, {0,1} {2,3} {4,5} {6,7}, whose
gradients are all-reduced on a pair group made with dist.new_group; once per step every
rank all-reduces its loss and token count on the default (world) group for the sweep's
shared metrics log. A custom length-bucketing sampler has a bug: rank 5's shard was never
shuffled and is sorted by length, so from step 15 rank 5 gets the long documents: its
batches are 4x as long (4x the tokens, 4x the compute) as everyone else's. Rank 4 waits for
rank 5 in their pair's gradient all-reduce, and all 8 ranks wait in the world metrics
all-reduce: the whole sweep runs at rank 5's pace. Nothing fails or hangs.

torchrun, 8 ranks, gloo, two process groups per rank (its pair group and the world group),
no DataLoader workers, no hangtrace phase API.

Expected: progressing, rank 5 named as the straggler (not rank 4, its partner, which only
waits for it; since about step 15, not checked: the script marks no steps).
"""
LAUNCH = "torchrun"
NPROC = 8
STEPS = 60
DUMP_AT_STEP = 30
EXPECT = {"straggler": 5, "since_step": None, "min_added_pct": 30}

import datetime
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn


def say(msg, **_):
    sys.stdout.write(msg + "\n")  # one write: ranks share the console
    sys.stdout.flush()


VOCAB = 512
DIM = 64
BATCH = 12
SHORT_LEN = 48
LONG_FROM_STEP = 15
UNSHUFFLED_RANK = 5


class TinyLM(nn.Module):
    def __init__(self, width):  # the sweep varies the learning rate only
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.ff = nn.Sequential(nn.Linear(DIM, width), nn.GELU(), nn.Linear(width, DIM))
        self.out = nn.Linear(DIM, VOCAB)

    def forward(self, toks):
        h = self.emb(toks)
        h = h + self.ff(h)
        return self.out(h)


def batch_for(rank, step, g):
    # the bucketing sampler: rank 5's shard is sorted by length, long documents last
    long_docs = rank == UNSHUFFLED_RANK and step >= LONG_FROM_STEP
    length = SHORT_LEN * 4 if long_docs else SHORT_LEN
    return torch.randint(0, VOCAB, (BATCH, length + 1), generator=g)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=180))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    pairs = [dist.new_group([2 * i, 2 * i + 1]) for i in range(world // 2)]  # every rank, one order
    my_pair = pairs[rank // 2]
    variant = rank // 2
    torch.manual_seed(variant)
    model = TinyLM(width=256)
    for p in model.parameters():  # both members of a pair start from the same weights
        dist.broadcast(p.data, src=2 * variant, group=my_pair)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4 * (variant + 1))
    g = torch.Generator().manual_seed(1000 + rank)
    rows = []  # (step, compute_ms, pair_allreduce_ms, world_allreduce_ms, step_ms)
    for step in range(STEPS):
        t0 = time.perf_counter()
        toks = batch_for(rank, step, g)
        logits = model(toks[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), toks[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        t1 = time.perf_counter()
        for p in model.parameters():
            dist.all_reduce(p.grad, group=my_pair)
            p.grad /= 2
        t2 = time.perf_counter()
        opt.step()
        metrics = torch.tensor([loss.item() * toks.numel(), float(toks.numel())])
        dist.all_reduce(metrics)  # the sweep's shared log, on the world group
        t3 = time.perf_counter()
        rows.append((step, (t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3, (t3 - t0) * 1e3))
        if rank == 0:
            print(f"step {step} loss {metrics[0].item() / metrics[1].item():.4f} "
                  f"({(t3 - t0) * 1e3:.0f} ms)", flush=True)

    for name, sel in (("before", [r for r in rows if 3 <= r[0] < LONG_FROM_STEP]),
                      ("after", [r for r in rows if r[0] >= LONG_FROM_STEP + 2])):
        med = lambda i: statistics.median(r[i] for r in sel)
        say(f"TIMING rank {rank} steps {name} step {LONG_FROM_STEP}: median step {med(4):.1f} ms, "
              f"compute {med(1):.1f} ms, pair all_reduce {med(2):.1f} ms, world all_reduce "
              f"{med(3):.1f} ms (n={len(sel)})", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
