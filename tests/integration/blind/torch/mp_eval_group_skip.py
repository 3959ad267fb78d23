"""Incident: 4 ranks started with plain multiprocessing (fork; each child sets RANK,
WORLD_SIZE, MASTER_ADDR/PORT and calls init_process_group("gloo")), DDP on a small MLP,
DataLoader(num_workers=2) per rank. Every 5 steps an eval: ``compute_accuracy``, then
``all_reduce`` of the metric and ``barrier`` on a gloo group of their own (``eval_pg``),
inside ``try: ... except Exception: logger.warning(...); continue``. At step 10 rank 3's eval
shard is empty: ZeroDivisionError, caught; rank 3 skips the eval's all_reduce and barrier
and goes into the next step's backward (DDP's all-reduce on the default group); ranks 0-2
wait in the eval all_reduce.

Written blind on 2026-12-04 by a helper that had read only the README (helper 85), as a
variant of the incident (the eval on the default group makes gloo abort on the size
mismatch instead of hanging; that variant's verdict named rank 3 and "never called
all_reduce ... went on past it, into a collective torch issued itself"). First verdict of
this one **partly right**: "Cross-group deadlock: ranks 0-3 wait on each other in a cycle
over groups '0', '1' (entered in different orders); named: rank 3 ... Next: make every rank
enter these groups in the same order". The author expected skipped-collective [3]. The job
records no step (no ``tracer.step``), so the records cannot tell a skip from the two groups
entered in another order on this step only (the blind job mp_group_cycle does that after
warm-up): the verdict stays a cross-group deadlock, and now says that until then every rank
had issued group '1''s collectives at the same places among group '0''s and rank 3 broke
that order (skipped the all_reduce ranks 0-2 wait in, or took another order), with advice
about an exception caught and passed over (analyze/grouporder.py). With ``tracer.step`` it
is a skipped collective (rule broken_order).
"""
LAUNCH = "mp"
NPROC = 4
EXPECT = {"kind": "cross-group-deadlock", "culprit_ranks": [3], "cause": None,
          "says": ("rank 3 broke that order here: it skipped all_reduce seq 3 on group '1' (ranks 0-2 wait in it)",
                   "an exception caught and passed over")}

import logging
import multiprocessing as mp
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

WORLD_SIZE = 4
TOTAL_STEPS = 40
EVAL_EVERY = 5

logging.basicConfig(level=logging.INFO,
                    format="%(asctime)s [rank %(rank)s] %(levelname)s %(message)s")


def make_logger(rank):
    return logging.LoggerAdapter(logging.getLogger("train"), {"rank": rank})


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def compute_accuracy(preds, labels):
    correct = (preds.argmax(dim=1) == labels).sum().item()
    return correct / len(labels)          # empty shard -> ZeroDivisionError


def eval_shard(rank, step):
    g = torch.Generator().manual_seed(1000 + step)
    n = 64
    x = torch.randn(n, 16, generator=g)
    y = torch.randint(0, 4, (n,), generator=g)
    # data-dependent shard split: at step 10 the filter leaves rank 3 nothing
    if step == 10 and rank == 3:
        return x[:0], y[:0]
    return x[rank::WORLD_SIZE], y[rank::WORLD_SIZE]


def worker(rank, port):
    os.environ["RANK"] = str(rank)
    os.environ["WORLD_SIZE"] = str(WORLD_SIZE)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    log = make_logger(rank)
    dist.init_process_group("gloo")
    eval_pg = dist.new_group(backend="gloo")  # CPU metrics group

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    loss_fn = nn.CrossEntropyLoss()

    ds = TensorDataset(torch.randn(2048, 16), torch.randint(0, 4, (2048,)))
    sampler = DistributedSampler(ds, num_replicas=WORLD_SIZE, rank=rank)
    loader = DataLoader(ds, batch_size=32, sampler=sampler, num_workers=2)

    step = 0
    epoch = 0
    while step < TOTAL_STEPS:
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            step += 1
            if step > TOTAL_STEPS:
                break
            opt.zero_grad()
            loss = loss_fn(ddp(xb), yb)
            loss.backward()              # DDP gradient all-reduce (C++)
            opt.step()
            if rank == 0:
                log.info("step %d loss %.4f", step, loss.item())
            time.sleep(0.2)

            if step % EVAL_EVERY == 0:
                try:
                    ddp.eval()
                    with torch.no_grad():
                        ex, ey = eval_shard(rank, step)
                        acc = compute_accuracy(ddp.module(ex), ey)
                    metric = torch.tensor([acc], dtype=torch.float32)
                    dist.all_reduce(metric, group=eval_pg)
                    dist.barrier(group=eval_pg)
                    if rank == 0:
                        log.info("step %d eval acc %.3f", step, metric.item() / WORLD_SIZE)
                except Exception as e:
                    log.warning("eval failed: %s", e)
                    continue
                finally:
                    ddp.train()
        epoch += 1

    dist.barrier()
    dist.destroy_process_group()
    log.info("done")


def main():
    ctx = mp.get_context("fork")
    port = free_port()
    procs = [ctx.Process(target=worker, args=(r, port)) for r in range(WORLD_SIZE)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    codes = [p.exitcode for p in procs]
    print("exit codes", codes)
    raise SystemExit(max(abs(c or 0) for c in codes))


if __name__ == "__main__":
    main()
