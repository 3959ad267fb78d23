"""Incident: launched by torchrun --nproc_per_node=2 (the agent sets RANK, WORLD_SIZE=2 and
MASTER_* correctly), but the script calls init_process_group("gloo", init_method="env://",
world_size=3, rank=RANK) with a world size left over from another config. Both ranks wait
forever for a third. The verdict must say the ranks are stuck in the rendezvous and that
their call asks for world size 3 where WORLD_SIZE is 2 (the callers, ranks 0 and 1, are
at fault; no rank 2 will come).

Written blind by a helper (2026-12-02) from this description and the README.
"""
LAUNCH = "torchrun"
NPROC = 2
EXPECT = {"kind": "unknown", "culprit_ranks": [0, 1], "cause": "stalled-in-rendezvous"}
STARTUP_STALL_S = 10

import os

import torch
import torch.distributed as dist

WORLD_SIZE_FROM_OLD_CONFIG = 3

rank = int(os.environ["RANK"])
print(f"rank {rank} pid {os.getpid()} env WORLD_SIZE={os.environ['WORLD_SIZE']} "
      f"MASTER={os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}", flush=True)
dist.init_process_group("gloo", init_method="env://", world_size=WORLD_SIZE_FROM_OLD_CONFIG, rank=rank)
t = torch.ones(4)
dist.all_reduce(t)
print(f"rank {rank}: {t.tolist()}", flush=True)
dist.destroy_process_group()
