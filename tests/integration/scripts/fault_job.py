"""Small 2-rank gloo job that prints a result; used with broken run directories.

Options: ``--fill PATH`` writes zeros into PATH until the disk is full (after the ring
exists), ``--phases N`` enters N phases with distinct names (string table growth),
``--iters N`` all_reduces (default 200).
"""

import argparse
import errno
import os

import torch
import torch.distributed as dist
from hangtrace import tracer

ap = argparse.ArgumentParser()
ap.add_argument("--fill")
ap.add_argument("--phases", type=int, default=0)
ap.add_argument("--iters", type=int, default=200)
a = ap.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
if a.fill:
    dist.barrier()
    if rank == 0:
        fd = os.open(a.fill, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while True:
                os.write(fd, bytes(4096))
        except OSError as e:
            assert e.errno == errno.ENOSPC, e
        finally:
            os.close(fd)
    dist.barrier()
total = torch.zeros(1)
for i in range(a.iters):
    t = torch.ones(1) * (rank + 1)
    dist.all_reduce(t)
    total += t
for i in range(a.phases):
    with tracer.phase("phase-with-a-rather-long-unique-name-%06d" % i, step=i):
        tracer.heartbeat()
objs = [None, None]
dist.all_gather_object(objs, {"rank": rank})
print("result", rank, float(total[0]), objs, flush=True)
dist.destroy_process_group()
