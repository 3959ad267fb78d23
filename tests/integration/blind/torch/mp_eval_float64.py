"""Incident (mixed precision slip, written blind 2026-12-02): a small regression model's loss
metric is all-reduced as float32 every step for logging; at step 5 rank 1 computes its eval
metric with numpy and all-reduces it as float64. gloo aborts rank 0 (it receives 8 bytes
where it expects 4), although rank 1 changed. torch.multiprocessing.spawn; the parent sets
RANK/WORLD_SIZE/MASTER_* (as a cluster wrapper does); uninstrumented.
"""
LAUNCH = "spawn"
NPROC = 2
EXPECT = {"kind": "collective-mismatch", "culprit_ranks": [1], "cause": "mismatch"}

import logging
import os
import time
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

STEPS = 10
EVAL_EVERY = 5


def make_data(rank):
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(256, 32, generator=g)
    y = x @ torch.randn(32, 1, generator=g) + 0.1 * torch.randn(256, 1, generator=g)
    return TensorDataset(x, y)


def worker(rank, world_size, eval_bf16_ranks):
    logging.basicConfig(level=logging.INFO,
                        format=f"%(asctime)s [rank {rank}] %(message)s")
    log = logging.getLogger("train")
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=90))
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loader = DataLoader(make_data(rank), batch_size=16, shuffle=True, num_workers=2)
    it = iter(loader)

    for step in range(STEPS):
        t0 = time.time()
        x, y = next(it)
        if step > 0 and step % EVAL_EVERY == 0:
            model.eval()
            use_bf16 = rank in eval_bf16_ranks
            with torch.no_grad():
                pred = model(x)
                if use_bf16:  # this rank's eval helper computes the metric with numpy
                    err = (pred.numpy() - y.numpy()) ** 2
                    metric = torch.from_numpy(np.array([err.mean()], dtype=np.float64))
                else:
                    metric = (pred - y).pow(2).mean().reshape(1)
            model.train()
            tag = "eval"
        else:
            pred = model(x)
            loss = nn.functional.mse_loss(pred, y)
            opt.zero_grad()
            loss.backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world_size
            opt.step()
            metric = loss.detach().reshape(1)
            tag = "train"
        dist.all_reduce(metric)
        metric /= world_size
        log.info("step %d %s loss %.4f (%.2fs)", step, tag, metric.item(), time.time() - t0)

    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    # the cluster wrapper exports these for the node
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE=str(NPROC), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    world_size = int(os.environ["WORLD_SIZE"])
    print(f"launching {world_size} ranks on {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
          f" (RANK={os.environ.get('RANK')})", flush=True)
    mp.spawn(worker, args=(world_size, {1}), nprocs=world_size, join=True)
