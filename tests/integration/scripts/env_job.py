"""A 2-rank gloo job for the environment-forensics tests (issue 12).

argv: MODE LIB. Every rank loads LIB with ctypes after joining the group.
- hang: rank 0 enters an all_reduce; rank 1 then blocks reading stdin (a hang outside
  any collective). Both print READY first.
- crash: rank 1 calls LIB's call_crash() (SIGSEGV inside the library); rank 0 prints
  READY and waits in an all_reduce.
"""

import ctypes
import os
import sys

import torch
import torch.distributed as dist

mode, lib_path = sys.argv[1], sys.argv[2]
dist.init_process_group(
    "gloo",
    init_method="tcp://%s:%s" % (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]),
    rank=int(os.environ["RANK"]),
    world_size=int(os.environ["WORLD_SIZE"]),
)
rank = dist.get_rank()
lib = ctypes.CDLL(lib_path)
dist.barrier()
if mode == "hang":
    print("READY %d %d" % (rank, lib.plugin_build()), flush=True)
    if rank == 0:
        dist.all_reduce(torch.ones(1))
    else:
        sys.stdin.readline()
elif mode == "crash":
    print("READY %d" % rank, flush=True)
    if rank == 1:
        lib.call_crash()
    else:
        dist.all_reduce(torch.ones(1))
