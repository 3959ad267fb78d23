"""Incident (RL post-training, torchrun, 2 ranks): each rank's main thread runs
``asyncio.run(main())``; a rollout task (``asyncio.create_task``, never awaited) reads prompts
from a DataLoader (num_workers=2), scores them with a reward function and puts samples into an
``asyncio.Queue(maxsize=4)``; the trainer coroutine does ``await queue.get()`` and all-reduces
gradients and the loss. On rank 1 at rollout step 8 the reward function raises
``KeyError: 'source'``: the task dies unseen, rank 1's trainer waits on the queue forever and
rank 0 waits in all_reduce.

Written blind on 2026-12-04 by a helper that had read only the README (helper 80). First
verdict partly right: rank 1 at ``await queue.get()`` (job.py:31), but the KeyError only in
report.txt's evidence. Now the paragraph says "It stopped after an exception: rank 1's asyncio
task 'rollout' raised KeyError: 'source' at reward_fn (...:17) and nobody retrieved it ...".
"""
LAUNCH = "torchrun"
NPROC = 2
EXPECT = {"kind": "stuck-outside-collective", "culprit_ranks": [1], "cause": None,
          "says": ("asyncio task 'rollout' raised KeyError: 'source' at reward_fn",)}

import asyncio, os, random, time
import torch, torch.nn as nn
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

class Prompts(Dataset):
    def __len__(self): return 10_000
    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return {"prompt": torch.randn(16, generator=g), "id": i}

def reward_fn(sample, step, rank):
    meta = {"len": 16, "source": "synthetic"}
    if rank == 1 and step == 8:
        meta.pop("source")  # the missing field
    return float(sample.sum()) * 0.01 + (1.0 if meta["source"] == "synthetic" else 0.0)

async def rollout(queue, loader, policy, rank):
    step = 0
    for batch in loader:
        with torch.no_grad():
            out = policy(batch["prompt"])
        rewards = torch.tensor([reward_fn(o, step, rank) for o in out])
        await queue.put((batch["prompt"], rewards))
        step += 1
        await asyncio.sleep(0.05)

async def trainer(queue, policy, opt, rank, world, n_steps):
    for step in range(n_steps):
        prompts, rewards = await queue.get()
        loss = -(policy(prompts).mean(dim=1) * rewards).mean()
        opt.zero_grad(); loss.backward()
        for p in policy.parameters():
            dist.all_reduce(p.grad); p.grad /= world
        l = loss.detach().clone(); dist.all_reduce(l)
        opt.step()
        if rank == 0:
            print(f"step {step} loss {l.item()/world:.4f}", flush=True)
        await asyncio.sleep(0.2)

async def main():
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    policy = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
    opt = torch.optim.SGD(policy.parameters(), lr=0.01)
    loader = DataLoader(Prompts(), batch_size=8, num_workers=2, shuffle=False)
    queue = asyncio.Queue(maxsize=4)
    asyncio.create_task(rollout(queue, loader, policy, rank))  # never awaited
    await trainer(queue, policy, opt, rank, world, 50)

if __name__ == "__main__":
    dist.init_process_group("gloo")
    asyncio.run(main())
    dist.destroy_process_group()
