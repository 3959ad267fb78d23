"""Incident: torchrun, 3 ranks, DDP with a DataLoader (num_workers=2). Every 5 steps an eval:
metrics, ``dist.all_gather_object``, ``dist.barrier()``, all inside ``try: ... except
Exception as e: logger.warning(...); continue``. At the step-10 eval rank 2's shard is empty,
its metric raises ZeroDivisionError, the except swallows it and ``continue``s: rank 2 skips the
all_gather_object and the barrier and goes into the next step's backward (DDP's gradient
all-reduce) while ranks 0-1 wait in all_gather_object.

Written blind on 2026-12-04 by a helper that had read only the README (helper 82). First
verdict partly right: rank 2 and the places, but "rank 2 issues collectives ... from 2 threads
(its main thread, 'python3')" (DDP's all-reduce, issued on the autograd thread, seen only by
torch's Flight Recorder) with advice about threads. Now: "... Rank 2 never called
all_gather_object: ranks 0-1 wait in it (call 3 on the group by the program's own count),
while rank 2's last call there was barrier (call 2): it went on past it ..." and the
skipped-collective advice (an exception swallowed on that rank).
"""
LAUNCH = "torchrun"
NPROC = 3
EXPECT = {"kind": "collective-mismatch", "culprit_ranks": [2], "cause": None,
          "says": ("Rank 2 never called all_gather_object",)}

import logging, os, time
import torch, torch.nn as nn, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset, DistributedSampler

logging.basicConfig(level=logging.INFO, format="%(asctime)s rank%(rank)s %(levelname)s %(message)s")
logger = logging.getLogger("train")

def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    logger = logging.LoggerAdapter(logging.getLogger("train"), {"rank": rank})
    torch.manual_seed(0)
    X = torch.randn(960, 16); y = (X.sum(1) > 0).long()
    ds = TensorDataset(X, y)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=16, sampler=sampler, num_workers=2, persistent_workers=True)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    lossf = nn.CrossEntropyLoss()

    # eval set: each rank gets a shard; shard size shrinks as "filtered" eval samples grow
    EX = torch.randn(90, 16); Ey = (EX.sum(1) > 0).long()

    def eval_shard(step):
        idx = list(range(rank, len(EX), world))
        # simulate a data filter that leaves rank 2 with an empty shard at step 10
        if rank == 2 and step == 10:
            idx = []
        return EX[idx], Ey[idx]

    def compute_metrics(step):
        ex, ey = eval_shard(step)
        with torch.no_grad():
            pred = model.module(ex).argmax(1) if len(ex) else torch.empty(0, dtype=torch.long)
        correct = int((pred == ey).sum())
        return {"step": step, "acc": correct / len(ey), "n": len(ey)}  # ZeroDivisionError if empty

    step = 0
    it = iter(loader)
    for epoch in range(100):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            step += 1
            opt.zero_grad()
            loss = lossf(model(xb), yb)
            loss.backward()
            opt.step()
            logger.info("step %d loss %.4f", step, loss.item())
            time.sleep(0.2)
            if step % 5 == 0:
                try:
                    metrics = compute_metrics(step)
                    all_metrics = [None] * world
                    dist.all_gather_object(all_metrics, metrics)
                    dist.barrier()
                    if rank == 0:
                        logger.info("eval step %d: %s", step, all_metrics)
                        torch.save(model.state_dict(), f"/tmp/blind82/ckpt_{step}.pt")
                except Exception as e:
                    logger.warning("eval failed: %s", e)
                    continue
            if step >= 30:
                break
        if step >= 30:
            break
    dist.destroy_process_group()

if __name__ == "__main__":
    main()
