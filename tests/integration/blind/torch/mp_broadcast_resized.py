"""Incident (replicas kept in sync by broadcast, written blind 2026-12-02): three workers
started with multiprocessing.Process and a tcp:// rendezvous; each step rank 0 broadcasts its
copy of a small embedding-like table. At step 4 rank 1 grows its table to (4, 5) when it sees
a new token id. gloo writes rank 0's 64 bytes into rank 1's 80-byte buffer and completes:
the job exits 0 and rank 1 runs on with wrong data. uninstrumented.
"""
LAUNCH = "python"
NPROC = 3
EXPECT = {"kind": "collective-mismatch", "culprit_ranks": [1], "cause": "mismatch"}

import logging
import multiprocessing as mp
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

WORLD = 3
STEPS = 8
DIM, VOCAB = 4, 4
INIT = "tcp://127.0.0.1:29653"


def token_stream(rank, step):
    g = torch.Generator().manual_seed(100 * rank + step)
    ids = torch.randint(0, VOCAB, (16,), generator=g)
    if rank == 1 and step == 4:
        ids[3] = VOCAB  # an unseen token shows up in this shard
    return ids


def maybe_grow(table, ids):
    # grow the table so every token id has a column
    need = int(ids.max()) + 1
    if need > table.shape[1]:
        grown = torch.zeros(table.shape[0], need)
        grown[:, : table.shape[1]] = table
        return grown
    return table


def worker(rank):
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s [rank {rank}] %(message)s")
    log = logging.getLogger("sync")
    dist.init_process_group("gloo", init_method=INIT, rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=90))
    torch.manual_seed(0)
    table = torch.randn(DIM, VOCAB)
    for step in range(STEPS):
        t0 = time.time()
        ids = token_stream(rank, step)
        table = maybe_grow(table, ids)
        # local update: pull the used columns toward their mean
        cols = table[:, ids]
        grad = cols - cols.mean(1, keepdim=True)
        table.index_add_(1, ids, -0.01 * grad)
        dist.broadcast(table, src=0)
        log.info("step %d table %s norm %.4f (%.2fs)", step, tuple(table.shape),
                 table.norm().item(), time.time() - t0)
        time.sleep(0.2)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    procs = [mp.Process(target=worker, args=(r,)) for r in range(WORLD)]
    for p in procs:
        p.start()
    deadline = time.time() + 120
    for p in procs:
        p.join(max(0, deadline - time.time()))
    codes = []
    for p in procs:
        if p.is_alive():
            p.terminate()
            p.join()
        codes.append(p.exitcode)
    print("exit codes", codes, flush=True)
    sys.exit(0 if all(c == 0 for c in codes) else 1)
