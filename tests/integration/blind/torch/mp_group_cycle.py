"""Incident: two process groups entered in different orders. World = {0,1,2}; an
expert-parallel group "ep" = {0,1}. Every rank all_reduces the loss on the world group and
then (ranks 0,1) the expert grads on "ep" -- except rank 1, which (as the "last EP stage")
syncs its expert grads first. At step 2 rank 1 waits in the ep all_reduce for rank 0 while
rank 0 (with rank 2) waits in the world all_reduce for rank 1: a cycle over two groups.
Plain multiprocessing.Process with the "fork" start method; phases/steps instrumented.
"""
LAUNCH = "mp"
NPROC = 3
EXPECT = {"kind": "cross-group-deadlock", "culprit_ranks": [1], "cause": None}

import datetime
import multiprocessing
import os
import socket
import sys
import time


def run(rank, world, port):
    import torch
    import torch.distributed as dist
    from hangtrace import tracer
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    ep = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=120), group_desc="ep")
    print(f"rank {rank} pid {os.getpid()} up", flush=True)
    expert = torch.nn.Linear(8, 8)
    dense = torch.nn.Linear(8, 1)
    last_ep_stage = rank == 1
    for step in range(1, 6):
        tracer.step(step)
        with tracer.phase("train"):
            x = torch.randn(4, 8)
            loss = dense(expert(x)).pow(2).mean()
            loss.backward()
            loss_t = loss.detach().view(1)
            eg = expert.weight.grad
            if last_ep_stage and step >= 2:      # "overlap" optimisation turned on after warm-up
                dist.all_reduce(eg, group=ep)
                dist.all_reduce(loss_t)
            else:
                dist.all_reduce(loss_t)
                if rank in (0, 1):
                    dist.all_reduce(eg, group=ep)
            expert.zero_grad(); dense.zero_grad()
        print(f"rank {rank} step {step} loss {loss_t.item():.4f}", flush=True)
        time.sleep(0.2)
    dist.destroy_process_group()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


if __name__ == "__main__":
    ctx = multiprocessing.get_context("fork")
    port = free_port()
    procs = [ctx.Process(target=run, args=(r, NPROC, port)) for r in range(NPROC)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    codes = [p.exitcode for p in procs]
    print("exit codes", codes, flush=True)
    sys.exit(1 if any(codes) else 0)
