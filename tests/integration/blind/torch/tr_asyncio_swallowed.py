"""Incident: each rank runs an asyncio loop; a background task (asyncio.create_task) streams
batches from a tokenizer server into an asyncio.Queue. On rank 1 at batch 3 the task raises
RuntimeError("tokenizer server returned 503"); nobody awaits the task, so the exception is
swallowed, and the main coroutine waits forever on queue.get() -- outside any collective --
while rank 0 waits in the gradient all_reduce. torchrun, 2 ranks, phases/steps instrumented.
"""
LAUNCH = "torchrun"
NPROC = 2
EXPECT = {"kind": "stuck-outside-collective", "culprit_ranks": [1], "cause": None}

import asyncio
import datetime
import os

import torch
import torch.distributed as dist

from hangtrace import tracer


async def tokenizer_feed(rank, q):
    for i in range(1, 100):
        await asyncio.sleep(0.05)                     # HTTP round trip to the tokenizer server
        if rank == 1 and i == 3:
            raise RuntimeError("tokenizer server returned 503")
        await q.put(torch.randn(4, 16))


async def train(rank, world):
    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    q = asyncio.Queue(maxsize=4)
    feeder = asyncio.create_task(tokenizer_feed(rank, q))     # never awaited
    for step in range(1, 7):
        tracer.step(step)
        with tracer.phase("data"):
            x = await asyncio.wait_for(q.get(), timeout=170)
        with tracer.phase("train"):
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
            opt.step()
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
    feeder.cancel()


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"rank {rank} pid {os.getpid()} up", flush=True)
    asyncio.run(train(rank, world))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
