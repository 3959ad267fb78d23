"""Two-rank gloo jobs where one rank alone issues a collective inside the training loop
(issue 37: which side changed, by each rank's own history). No ``tracer.step``/``phase``:
records carry no step, as under Lightning or HF Trainer.

argv[1]:
  'barrier' -> every step both ranks broadcast a flag from rank 0 (Lightning's per-step
               SIGTERM flag) and run a DDP step (its bucket all-reduce is C++-issued, seen
               only by torch's Flight Recorder); at step 5 rank 0 alone calls
               ``dist.barrier()`` in a callback: it meets rank 1's next broadcast; both hang.
  'metric'  -> every step a DDP step only (its C++ bucket all-reduce); at step 5 rank 0 alone
               all-reduces a one-float metric in a callback: it meets rank 1's bucket
               all-reduce of the next step (gloo's size check aborts one of them).
  'size'    -> every step both ranks all_reduce 8 floats; at step 5 rank 0 alone all_reduces
               a 16-float tensor first (a metric of its own): gloo's size check aborts a
               rank (SIGABRT, "Received data size doesn't match expected size").
Prints 'STEP <rank> <i>' at each step.
"""

import datetime
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

mode = sys.argv[1]
rank = int(os.environ["RANK"])
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
torch.manual_seed(0)


def on_step_end(i: int) -> None:
    """A rank-0-only callback (the incident)."""
    if i == 5 and rank == 0:
        if mode == "barrier":
            dist.barrier()
        elif mode == "metric":
            dist.all_reduce(torch.ones(1))
        else:
            dist.all_reduce(torch.ones(16))


if mode in ("barrier", "metric"):
    model = DDP(torch.nn.Linear(8, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
for i in range(1, 40):
    print("STEP %d %d" % (rank, i), flush=True)
    if mode in ("barrier", "metric"):
        if mode == "barrier":
            flag = torch.zeros(1, dtype=torch.int64)
            dist.broadcast(flag, src=0)
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
    else:
        dist.all_reduce(torch.ones(8))
    on_step_end(i)
print("DONE %d" % rank, flush=True)
