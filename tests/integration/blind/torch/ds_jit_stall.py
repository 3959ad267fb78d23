"""Incident (DeepSeek-v4-Flash on DGX-Spark #117): a tensor-parallel serving loop. Mid-serve a
request with a new shape makes rank 1 JIT-compile a kernel; the "compiler" (here a
subprocess `sleep 150`) runs for minutes, so rank 1 sits outside any collective while rank 0
waits in the logits all_reduce. Rank 0's serving watchdog would later kill it and the
operator would blame rank 0. torchrun, 2 ranks, a watchdog thread, uninstrumented.
"""
LAUNCH = "torchrun"
NPROC = 2
EXPECT = {"kind": "stuck-outside-collective", "culprit_ranks": [1], "cause": None}

import datetime
import os
import signal
import subprocess
import threading
import time

import torch
import torch.distributed as dist

_compiled = set()


def jit_kernel(rank, shape):
    if shape in _compiled:
        return
    if rank == 1 and shape[0] > 16:
        print(f"rank {rank} compiling kernel for shape {shape} ...", flush=True)
        subprocess.run(["sleep", "150"], check=True)     # stand-in for nvcc/triton compile
    _compiled.add(shape)


def watchdog(rank, last_ok, stop):
    # a serving health check: kill ourselves if no request completed for 100 s
    while not stop.wait(1.0):
        if time.time() - last_ok[0] > 100:
            print(f"rank {rank} watchdog: no request for 100 s, SIGTERM", flush=True)
            os.kill(os.getpid(), signal.SIGTERM)
            return


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"rank {rank} pid {os.getpid()} up", flush=True)
    torch.manual_seed(0)
    shard = torch.nn.Linear(32, 64 // world)      # column-parallel shard
    last_ok, stop = [time.time()], threading.Event()
    threading.Thread(target=watchdog, args=(rank, last_ok, stop), daemon=True).start()
    seqlens = [8, 8, 12, 8, 24, 8, 8]              # request 5 has a new shape
    for req, n in enumerate(seqlens, start=1):
        tokens = torch.zeros(n, dtype=torch.long)
        if rank == 0:
            tokens = torch.randint(0, 1000, (n,))
        dist.broadcast(tokens, src=0)              # rank 0 receives requests
        h = torch.nn.functional.one_hot(tokens % 32, 32).float()
        jit_kernel(rank, tuple(h.shape))
        out = shard(h).sum(0)
        logits = torch.zeros(64)
        logits[rank * 32:(rank + 1) * 32] = out
        dist.all_reduce(logits)
        last_ok[0] = time.time()
        print(f"rank {rank} served request {req} (len {n})", flush=True)
        time.sleep(0.2)
    stop.set()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
