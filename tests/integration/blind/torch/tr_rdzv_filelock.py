"""Four ranks build a shared cache under a filelock; rank 0 calls init_process_group inside
the locked block, ranks 1-3 wait for the lock before theirs: the rendezvous never completes.

Written blind on 2026-12-04 by a helper that had read only the README (helper 59), from that
incident; its verdict was "Unknown" (fixed: rule before_rendezvous and the file locks a
process holds). For the corpus: the cache folder is a temp folder named after MASTER_PORT
(one per run, the same for every rank) instead of a fixed one.
"""
LAUNCH = "torchrun"
NPROC = 4
STARTUP_STALL_S = 10
EXPECT = {"kind": "stuck-outside-collective", "culprit_ranks": [1, 2, 3],
          "says": ["never reached init_process_group", "in init_process_group (the rendezvous)",
                   "Rank 0 holds a file lock on"]}

import json
import os
import time

import torch
import torch.distributed as dist
from filelock import FileLock

from hangtrace import tracer

import tempfile
CACHE_DIR = os.path.join(tempfile.gettempdir(), "blind59-cache-%s" % os.environ.get("MASTER_PORT", "0"))
CACHE_FILE = os.path.join(CACHE_DIR, "tokenized.json")
LOCK_FILE = os.path.join(CACHE_DIR, "tokenized.lock")


def load_tokenizer(rank):
    # pretend to load a tokenizer; rank 0 is the quickest (it has it hot)
    time.sleep(0.2 if rank == 0 else 2.0)
    return {"vocab": 1000}


def build_cache(tok):
    rank = int(os.environ["RANK"])
    if not dist.is_initialized():
        # BUG: we want world size to shard the cache; init here, under the lock
        dist.init_process_group("gloo")
    world = dist.get_world_size()
    shards = [[i for i in range(rank, 4000, world)] for rank in range(world)]
    tmp = CACHE_FILE + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"vocab": tok["vocab"], "shards": shards}, f)
    os.replace(tmp, CACHE_FILE)


def prepare_cache(tok):
    os.makedirs(CACHE_DIR, exist_ok=True)
    with FileLock(LOCK_FILE):
        if not os.path.exists(CACHE_FILE):
            build_cache(tok)
    with open(CACHE_FILE) as f:
        return json.load(f)


def main():
    rank = int(os.environ["RANK"])
    with tracer.phase("setup"):
        tok = load_tokenizer(rank)
        cache = prepare_cache(tok)
        if not dist.is_initialized():
            dist.init_process_group("gloo")
    world = dist.get_world_size()
    my_shard = cache["shards"][rank]
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(5):
        tracer.step(step)
        with tracer.phase("train"):
            x = torch.randn(8, 16) + len(my_shard) * 0
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world
            opt.step()
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
