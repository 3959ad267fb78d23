"""Async-rollout RL loop: the rollout actor's background batcher task dies on batch 4.

Incident (blind helper 98, 2026-12-04, run by a user as `hangtrace run --stall-s 15
--stop-on-stall -- python driver.py`): a driver, an async Rollout actor whose start() creates a
background asyncio task (_batcher) that serves generate() requests through an asyncio.Queue and
per-request futures, and two Trainer actors (ranks 0-1, gloo). On batch 4 _batcher raises KeyError
(a bug in its own sampling-params lookup); nobody retrieves the task's exception, so generate()
for step 4 awaits its future forever and the driver blocks in ray.get on the rollout; the trainers
are idle between calls. The verdict was right the first time (the actor, the task, the line, the
unretrieved exception); kept as a regression guard.

Corpus changes to the job as written (what the harness needs, nothing else): Ray is started with
address="local" (never another session's cluster) and the HANGTRACE environment is passed to the
workers through runtime_env by default (the job took it as --runtime-env-json).
"""
import argparse
import asyncio
import json
import os
import random
import socket
import time

import ray
import torch

LAUNCH = "ray"
EXPECT = {"kind": "dead-rank", "culprit_ranks": [], "culprit_actors": ["Rollout"], "cause": "exception",
          "summary_has": "asyncio task 'Rollout._batcher' raised KeyError"}


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


@ray.remote(num_cpus=0.25)
class Rollout:
    def __init__(self):
        self.queue = asyncio.Queue()
        self.batches_done = 0
        self._task = None
        # per-batch sampling params; the schedule only covers 3 batches (the bug)
        self.sampling_schedule = {1: {"temperature": 1.0}, 2: {"temperature": 0.9},
                                  3: {"temperature": 0.8}}

    async def start(self):
        if self._task is None:
            self._task = asyncio.create_task(self._batcher())
        return True

    async def _batcher(self):
        while True:
            req = await self.queue.get()
            batch_no = self.batches_done + 1
            params = self.sampling_schedule[batch_no]  # KeyError on batch 4
            await asyncio.sleep(0.3)  # "generate"
            n = len(req["prompts"])
            out = torch.randn(n, 8) * params["temperature"]
            self.batches_done = batch_no
            req["future"].set_result(out)

    async def generate(self, prompts):
        fut = asyncio.get_running_loop().create_future()
        await self.queue.put({"prompts": prompts, "future": fut})
        return await fut


@ray.remote(num_cpus=0.25)
class Trainer:
    def __init__(self, rank, world_size, addr, port):
        os.environ["MASTER_ADDR"] = addr
        os.environ["MASTER_PORT"] = str(port)
        os.environ["RANK"] = str(rank)
        os.environ["WORLD_SIZE"] = str(world_size)
        import torch.distributed as dist
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        self.rank = rank
        torch.manual_seed(0)
        self.model = torch.nn.Linear(8, 1)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)

    def ready(self):
        return self.rank

    def train_step(self, batch):
        import torch.distributed as dist
        self.opt.zero_grad()
        loss = self.model(batch).pow(2).mean()
        loss.backward()
        for p in self.model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        self.opt.step()
        return float(loss)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runtime-env-json", default=None)
    ap.add_argument("--steps", type=int, default=8)
    args = ap.parse_args()
    renv = json.loads(args.runtime_env_json) if args.runtime_env_json else \
        {"env_vars": {k: v for k, v in os.environ.items() if k.startswith("HANGTRACE")}}
    ray.init(address="local", num_cpus=2, runtime_env=renv, include_dashboard=False)
    port = free_port()
    rollout = Rollout.remote()
    trainers = [Trainer.remote(r, 2, "127.0.0.1", port) for r in range(2)]
    ray.get(rollout.start.remote())
    print("trainers ready", ray.get([t.ready.remote() for t in trainers]), flush=True)
    for step in range(1, args.steps + 1):
        t0 = time.time()
        prompts = [f"prompt {step}-{i}" for i in range(4)]
        batch = ray.get(rollout.generate.remote(prompts), timeout=600)
        losses = ray.get([t.train_step.remote(batch) for t in trainers])
        print(f"step {step} done loss {losses[0]:.4f} ({time.time()-t0:.2f}s)", flush=True)
    print("all done", flush=True)


if __name__ == "__main__":
    main()
