"""2 gloo ranks: rank 1 blocks in an all_reduce that rank 0 never joins (rank 0 sleeps)."""

import time

import torch
import torch.distributed as dist


def blocked_in_collective():
    print("entering", flush=True)
    dist.all_reduce(torch.ones(5))


def idle():
    print("waiting", flush=True)
    time.sleep(600)


dist.init_process_group("gloo")
dist.all_reduce(torch.ones(1))
if dist.get_rank() == 1:
    blocked_in_collective()
else:
    idle()
