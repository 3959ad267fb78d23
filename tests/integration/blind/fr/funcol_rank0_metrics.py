"""Incident: a metrics/logging path reduces a tensor with a FUNCTIONAL collective
(`torch.distributed._functional_collectives.all_reduce`, as DTensor / torch.compile code
paths and some metric libraries do) under `if rank == 0 and step == 3:`. Only rank 0 takes
that branch. The functional collective is dispatched to the C++ `_c10d_functional` ops,
not through the Python `torch.distributed.all_reduce`, and returns an AsyncCollectiveTensor
that rank 0 waits on when it calls `.item()` for the log line. Rank 1 goes on to its next
regular collective: the manual gradient all_reduce of step 4 (a data-parallel loop that
averages gradients by hand with `dist.all_reduce` on one flat buffer).

Expected verdict: rank 0 is the culprit, with the functional all_reduce (issued only on
rank 0, at step 3, from the metrics branch); rank 1 waits in its step-4 gradient
all_reduce. kind: collective-mismatch or skipped-collective (one extra collective on
rank 0). torchrun launcher, 2 ranks, gloo, CPU.
"""
LAUNCH = "torchrun"
NPROC = 2
EXPECT = {"kind": ("collective-mismatch", "skipped-collective"), "culprit_ranks": [0], "cause": None}

import datetime
import time

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol


def log_metrics(step, loss, grad_norm):
    # "cheap" global metrics: a functional all_reduce, meant to be called on every rank
    stats = torch.tensor([loss, grad_norm, 1.0])
    red = funcol.all_reduce(stats, "sum", dist.group.WORLD)
    red = red / red[2]
    print(f"[metrics] step {step} loss {red[0].item():.4f} gnorm {red[1].item():.4f}", flush=True)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    for p in model.parameters():
        dist.broadcast(p.data, src=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)

    for step in range(8):
        x, y = torch.randn(8, 32, generator=g), torch.randn(8, 1, generator=g)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        dist.all_reduce(flat)           # manual data-parallel gradient averaging
        flat /= world
        off = 0
        for p in model.parameters():
            n = p.numel()
            p.grad.copy_(flat[off:off + n].view_as(p))
            off += n
        opt.step()
        print(f"rank {rank}: step {step} loss {loss.item():.4f}", flush=True)
        if rank == 0 and step == 3:     # BUG: metrics only on the logging rank
            log_metrics(step, loss.item(), flat.norm().item())
        time.sleep(0.2)
    dist.barrier()
    print(f"rank {rank}: done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
