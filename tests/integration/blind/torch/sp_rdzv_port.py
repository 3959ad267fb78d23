"""Incident: torch.multiprocessing.spawn; the parent sets MASTER_ADDR, MASTER_PORT,
WORLD_SIZE=2 and RANK=0 in its own environment (as some frameworks do), each worker sets
its RANK from the spawn index. Because of a config bug, worker 1 overrides MASTER_PORT
with a stale per-host value. Both call init_process_group("gloo", init_method="env://"):
the rendezvous hangs. The verdict must say the ranks are stuck in the rendezvous and name
rank 1, the one with the wrong setting (rank 0 hosts the store).

Written blind by a helper (2026-12-02) from this description and the README; the ports
are free ports here instead of fixed ones.
"""
LAUNCH = "spawn"
NPROC = 2
EXPECT = {"kind": "unknown", "culprit_ranks": [1], "cause": "stalled-in-rendezvous"}
STARTUP_STALL_S = 10

import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def worker(idx):
    os.environ["RANK"] = str(idx)
    if idx == 1:
        # config bug: worker 1 reads the stale per-host value
        os.environ["MASTER_PORT"] = os.environ["STALE_HOST_MASTER_PORT"]
    print(f"worker {idx} pid {os.getpid()} RANK={os.environ['RANK']} "
          f"MASTER={os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}", flush=True)
    dist.init_process_group("gloo", init_method="env://")
    print(f"worker {idx} joined", flush=True)
    t = torch.ones(4)
    dist.all_reduce(t)
    print(f"worker {idx} all_reduce -> {t.tolist()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(free_port())
    os.environ["STALE_HOST_MASTER_PORT"] = str(free_port())
    os.environ["WORLD_SIZE"] = "2"
    os.environ["RANK"] = "0"
    print(f"launcher pid {os.getpid()}", flush=True)
    mp.spawn(worker, nprocs=2)
