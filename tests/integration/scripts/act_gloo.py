"""Tiny gloo job for torchrun: one all_reduce, prints the result."""

import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(2) * (dist.get_rank() + 1)
dist.all_reduce(t)
# one write per line: both workers share torchrun's stdout
os.write(1, ("result %d %d %s\n" % (dist.get_rank(), os.getpid(), t.tolist())).encode())
dist.destroy_process_group()
