"""DDP job whose only collectives after init_process_group are DDP's C++ gradient
all-reduces (no phase, no step, no Python collective): it trains ``N`` batches, 0.5 s
apart, then the last rank trains one batch more and every rank hangs (the others wait in
a barrier). Prints 'BATCH <i>' per batch and 'HANGING <rank>' before the call that hangs.
argv[1]: N."""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

n = int(sys.argv[1])
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
torch.manual_seed(0)
model = DDP(torch.nn.Linear(8, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
batches = n + (1 if rank == world - 1 else 0)
for i in range(batches):
    if i == n:
        print("HANGING %d" % rank, flush=True)
    opt.zero_grad()
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    print("BATCH %d" % i, flush=True)
    time.sleep(0.5)
print("HANGING %d" % rank, flush=True)
dist.barrier()
