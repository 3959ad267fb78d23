"""A gloo job for env-diff of libraries and packages (issue 41).

Every rank imports ``htpkg`` (its installed version depends on the rank's PYTHONPATH),
joins the group, loads ``libhtprobe.so`` by its bare name with ctypes (so the rank's
LD_LIBRARY_PATH decides which build is loaded, as when a second copy shadows another) and
prints ``READY <rank> <htprobe_build()> <htpkg version>``. Rank ``ODD_RANK`` (argv[1]) then
stalls reading stdin; the others wait in an all_reduce it never joins.
"""

import ctypes
import os
import sys

import htpkg
import torch
import torch.distributed as dist

odd = int(sys.argv[1])
dist.init_process_group(
    "gloo",
    init_method="tcp://%s:%s" % (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]),
    rank=int(os.environ["RANK"]),
    world_size=int(os.environ["WORLD_SIZE"]),
)
rank = dist.get_rank()
lib = ctypes.CDLL("libhtprobe.so")
dist.barrier()
print("READY %d %d %s" % (rank, lib.htprobe_build(), htpkg.VERSION), flush=True)
if rank == odd:
    sys.stdin.readline()
else:
    dist.all_reduce(torch.ones(1))
