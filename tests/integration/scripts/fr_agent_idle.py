"""A traced world-size-1 gloo rank that joined its group (so its Flight Recorder agent
listens), prints READY and waits to be killed."""

import os
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo", rank=0, world_size=1)
dist.all_reduce(torch.ones(4))
print("READY", os.getpid(), flush=True)
time.sleep(600)
