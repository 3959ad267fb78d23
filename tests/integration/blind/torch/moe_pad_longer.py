"""Incident (MoE token routing, written blind 2026-12-02): each step every rank all-reduces a
flat gradient bucket and exchanges per-expert token counts with all_gather_into_tensor; at
step 7 rank 2's batch is short and its code pads the counts to 10 where its peers have 8.
gloo aborts the rank that receives more data than it expects: rank 0 (it has the smaller
buffer), not rank 2. torchrun, 3 ranks, DataLoader(num_workers=2); uninstrumented.
"""
LAUNCH = "torchrun"
NPROC = 3
EXPECT = {"kind": "collective-mismatch", "culprit_ranks": [2], "cause": "mismatch"}

import logging
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

logging.basicConfig(level=logging.INFO, format="%(asctime)s [rank %(rank)s] %(message)s")

NUM_EXPERTS = 8
HIDDEN = 16
BATCH = 8
BUCKET = 1024
STEPS = 10


class TokenShard(Dataset):
    def __init__(self, rank, n):
        g = torch.Generator().manual_seed(1234 + rank)
        self.x = torch.randn(n, HIDDEN, generator=g)
        self.y = torch.randn(n, HIDDEN, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class TinyMoE(nn.Module):
    def __init__(self):
        super().__init__()
        self.router = nn.Linear(HIDDEN, NUM_EXPERTS)
        self.experts = nn.ModuleList(nn.Linear(HIDDEN, HIDDEN) for _ in range(NUM_EXPERTS))

    def forward(self, x):
        logits = self.router(x)
        ids = logits.argmax(-1)
        gate = logits.softmax(-1).gather(1, ids[:, None])
        out = torch.stack([self.experts[int(e)](x[i]) for i, e in enumerate(ids)])
        return out * gate, ids


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    log = logging.LoggerAdapter(logging.getLogger("moe"), {"rank": rank})
    torch.manual_seed(0)

    # the last rank's shard is uneven: 7 full batches and one of 6 tokens
    n = 7 * BATCH + 6 if rank == world - 1 else STEPS * BATCH
    loader = DataLoader(TokenShard(rank, n), batch_size=BATCH, num_workers=2, shuffle=False)

    model = TinyMoE()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    grad_bucket = torch.zeros(BUCKET)

    for step, (x, y) in enumerate(loader):
        t0 = time.time()
        out, ids = model(x)
        loss = F.mse_loss(out, y)
        opt.zero_grad()
        loss.backward()

        # flatten grads into the fixed-size bucket and average across ranks
        for p in model.parameters():
            if p.grad is None:  # experts that got no tokens this step
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.flatten() for p in model.parameters()])
        grad_bucket.zero_()
        grad_bucket[: min(BUCKET, flat.numel())] = flat[:BUCKET]
        dist.all_reduce(grad_bucket)
        grad_bucket /= world
        off = 0
        for p in model.parameters():
            k = p.numel()
            if off + k <= BUCKET:
                p.grad.copy_(grad_bucket[off:off + k].view_as(p.grad))
            off += k
        opt.step()

        # token counts per expert, padded to the number of "slots" in this batch
        counts = torch.bincount(ids, minlength=NUM_EXPERTS).float()
        slots = NUM_EXPERTS if x.shape[0] == BATCH else x.shape[0] + 4  # room for dropped tokens
        counts = counts[:slots] if counts.numel() > slots else F.pad(counts, (0, slots - counts.numel()))
        all_counts = torch.empty(world * counts.numel())
        dist.all_gather_into_tensor(all_counts, counts)
        load = all_counts.view(world, -1).sum(0)

        log.info("step %d loss %.4f expert load %s (%.2fs)", step, loss.item(),
                 load.int().tolist(), time.time() - t0)

    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
