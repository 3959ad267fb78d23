"""Incident: torch.multiprocessing.spawn, 3 ranks; the parent sets RANK=0, WORLD_SIZE,
MASTER_ADDR/PORT before spawn (every child inherits RANK=0) and each child takes its rank from
the spawn index. gloo, DDP on a small MLP, DataLoader(num_workers=2). Each rank's 'tokenizer'
thread parses records with ``parse_record`` into a ``queue.Queue(maxsize=4)``; the main loop
takes ``extra = q.get()`` each step. At step 8 rank 1's tokenizer meets a malformed record and
dies of ValueError (printed by Python's thread excepthook only); rank 1 blocks in ``q.get()``,
ranks 0 and 2 in DDP's gradient all-reduce.

Written blind on 2026-12-04 by a helper that had read only the README (helper 83): right on
the first run ("Stuck outside collectives: rank 1 is not in any collective: queue.get/put ...
It stopped after an exception: rank 1's thread 'tokenizer' died of ValueError: invalid literal
for int() with base 10: 'oops' at <listcomp> (...:43) ..."), 10 s after the hang; the frame
is now named "<listcomp> in parse_record". For the corpus: a free port instead of 29583.
"""
LAUNCH = "python"
NPROC = 3
EXPECT = {"kind": "stuck-outside-collective", "culprit_ranks": [1], "cause": None,
          "says": ("rank 1's thread 'tokenizer' died of ValueError", "<listcomp> in parse_record")}

import os
import queue
import threading
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

WORLD_SIZE = 3
STEPS = 40
BAD_STEP = 8
BAD_RANK = 1


class SyntheticDataset(Dataset):
    def __len__(self):
        return 4096

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(16, generator=g)
        y = x.sum(dim=0, keepdim=True)
        return x, y


def make_shard(rank, n):
    recs = []
    for i in range(n):
        if rank == BAD_RANK and i == BAD_STEP:
            recs.append("id=8;tokens=12,7,oops,3")  # malformed record
        else:
            recs.append("id=%d;tokens=%s" % (i, ",".join(str((i * 7 + k) % 50) for k in range(4))))
    return recs


def parse_record(rec):
    head, toks = rec.split(";")
    ids = [int(t) for t in toks.split("=")[1].split(",")]  # ValueError on a bad token
    return torch.tensor(ids, dtype=torch.float32)


def tokenizer_loop(shard, q):
    for rec in shard:
        q.put(parse_record(rec))


def worker(idx):
    rank = idx  # real rank from the spawn index; env RANK (=0) is inherited and wrong
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(SyntheticDataset(), batch_size=8, num_workers=2, shuffle=False)

    q = queue.Queue(maxsize=4)
    t = threading.Thread(target=tokenizer_loop, args=(make_shard(rank, STEPS), q),
                         name="tokenizer", daemon=True)
    t.start()

    it = iter(loader)
    for step in range(STEPS):
        extra = q.get()
        x, y = next(it)
        out = model(x)
        loss = nn.functional.mse_loss(out, y) + 1e-3 * extra.mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0:
            print("step %d loss %.4f" % (step, loss.item()), flush=True)
        time.sleep(0.25)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ["RANK"] = "0"
    os.environ["WORLD_SIZE"] = str(WORLD_SIZE)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    mp.spawn(worker, nprocs=WORLD_SIZE, join=True)
