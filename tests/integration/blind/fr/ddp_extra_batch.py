"""Incident: DDP training with uneven data shards and no `model.join()`.

The dataset is split by a naive `shard = data[rank::world]` on a length that is not a
multiple of the world size, so the LAST rank gets one more batch than the others.
Ranks 0..W-2 finish their epoch loop and go into the end-of-epoch `dist.barrier()`
(followed by an eval all_reduce). The last rank runs one more forward/backward: its
gradient all-reduce is issued from C++ by DDP's Reducer during backward (an autograd hook),
never through a Python `torch.distributed.all_reduce` call, and it can never be matched by
its peers, which sit in the barrier. On gloo the barrier is itself an all_reduce-ish
collective, so depending on the transport the ranks either hang (the usual report:
"training hangs at the end of the epoch") or mis-pair buffers.

Expected verdict: the last rank is the culprit; its DDP gradient all-reduce (from the
Reducer, during backward, at the extra batch) has no partner: the others wait in barrier.
kind: collective-mismatch (or skipped-collective: one more collective on the last rank).
torchrun launcher, 2 ranks, gloo, CPU (also run with 3 ranks: the last rank is then a
minority of one). Variant: `DDP_ANNOTATE=1` marks each batch with `tracer.step(i)` and
the loop with `tracer.phase("train")` / `tracer.phase("eval")` (the README's optional
annotations), to see whether they break the 2-rank tie.
"""
LAUNCH = "torchrun"
NPROC = 2
EXPECT = {"kind": ("collective-mismatch", "skipped-collective"), "culprit_ranks": [1], "cause": None}

import datetime
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

ANNOTATE = os.environ.get("DDP_ANNOTATE") == "1"
if ANNOTATE:
    from hangtrace import tracer
    phase = tracer.phase
else:
    import contextlib
    tracer = None
    phase = lambda name: contextlib.nullcontext()


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)

    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    # 5 batches of 8 samples, split naively by batch index: ranks get 3,2 (world 2) -> the
    # last rank must have more. Make the last rank get the remainder explicitly, as a
    # "last shard takes the tail" splitter does.
    n_batches = 4 * world + 1
    per = n_batches // world
    start = rank * per
    stop = n_batches if rank == world - 1 else start + per
    g = torch.Generator().manual_seed(1)
    xs = torch.randn(n_batches, 8, 32, generator=g)
    ys = torch.randn(n_batches, 8, 1, generator=g)
    my = list(range(start, stop))
    print(f"rank {rank}: {len(my)} batches", flush=True)

    for i, b in enumerate(my):
        if tracer is not None:
            tracer.step(i)
        with phase("train"):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(xs[b]), ys[b])
            loss.backward()          # DDP's Reducer all-reduces the gradients from C++ here
            opt.step()
        print(f"rank {rank}: batch {i} loss {loss.item():.4f}", flush=True)
        time.sleep(0.2)

    print(f"rank {rank}: epoch done, end-of-epoch barrier", flush=True)
    with phase("eval"):
        dist.barrier()
        metric = torch.tensor([loss.item()])
        dist.all_reduce(metric)
    print(f"rank {rank}: eval metric {metric.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
