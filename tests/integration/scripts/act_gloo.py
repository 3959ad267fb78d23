"""Tiny gloo job for torchrun: one all_reduce, prints the result."""
import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(2) * (dist.get_rank() + 1)
dist.all_reduce(t)
print("result", dist.get_rank(), os.getpid(), t.tolist(), flush=True)
dist.destroy_process_group()
