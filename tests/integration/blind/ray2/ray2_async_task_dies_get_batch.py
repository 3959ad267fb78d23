"""Miniature RL post-training loop: async rollout actor + 2 gloo trainer actors.

Incident: the rollout actor's fire-and-forget generation task dies (KeyError 'score'
in reward_fn) at step 6; get_batch awaits queue.get() forever, the driver blocks in
ray.get, the trainers sit idle.

Written blind on 2026-12-04 by a helper that had read only the README and docs/RAY.md
(helper 84). First verdict partly right: "Failed Ray actor: RolloutWorker 'rollout' (no rank)
failed first (cause: exception: asyncio task 'RolloutWorker._generate_loop' raised KeyError:
'score' at reward_fn (...:19) and nobody retrieved it)", without get_batch's wait in
``await queue.get()``, the driver's ``ray.get`` on it, or the idle trainers. Now the paragraph
adds "It lives on in get_batch: asyncio event loop: task ... in get (queues.py:158) <- get_batch
(...), ... The driver is blocked in ray.get on RolloutWorker 'rollout'.get_batch. Ranks 0-1
(Ray actors) are idle between method calls, in no collective." with the task advice. For the
corpus: ray.init with the job's HANGTRACE variables in runtime_env (the harness's way) and
address="local" instead of the author's --runtime-env-json argument.

EXPECTED verdict: kind dead-rank (the README's "producer whose background work raised");
culprit actor RolloutWorker 'rollout' (no rank); cause exception.
"""
LAUNCH = "ray"
EXPECT = {"kind": "dead-rank", "culprit_ranks": [], "culprit_actors": ["RolloutWorker 'rollout'"],
          "cause": "exception", "summary_has": "It lives on in get_batch"}

import argparse
import asyncio
import os
import random
import socket
import time

import ray


def reward_fn(sample):
    # the reward model's output is expected to carry a 'score' field
    return float(sample["score"]) - 0.01 * len(sample["tokens"])


@ray.remote(num_cpus=0)
class RolloutWorker:
    def __init__(self, bad_sample_index):
        self.queue = asyncio.Queue(maxsize=8)
        self.bad_sample_index = bad_sample_index
        self.produced = 0
        self._task = None

    async def start(self):
        # fire-and-forget: the task is never awaited nor checked again
        self._task = asyncio.create_task(self._generate_loop())
        return True

    def _fake_generate(self, i):
        tokens = [random.randint(0, 31) for _ in range(random.randint(4, 12))]
        sample = {"id": i, "tokens": tokens, "score": random.random()}
        if i == self.bad_sample_index:
            # the reward server returned a malformed record (no score)
            sample = {"id": i, "tokens": tokens, "error": "reward server timeout"}
        return sample

    async def _generate_loop(self):
        i = 0
        while True:
            await asyncio.sleep(0.02)  # "generation"
            sample = self._fake_generate(i)
            sample["reward"] = reward_fn(sample)
            await self.queue.put(sample)
            self.produced += 1
            i += 1

    async def get_batch(self, n):
        batch = []
        for _ in range(n):
            batch.append(await self.queue.get())
        return batch


@ray.remote(num_cpus=1)
class Trainer:
    def __init__(self, rank, world_size, port):
        import torch
        import torch.distributed as dist

        self.torch = torch
        self.dist = dist
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
        )
        self.rank = rank
        self.world_size = world_size
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(
            torch.nn.Embedding(32, 16), torch.nn.Linear(16, 1)
        )
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)

    def ready(self):
        return self.rank

    def train_step(self, batch):
        torch, dist = self.torch, self.dist
        # each rank takes its shard of the batch
        shard = batch[self.rank :: self.world_size]
        loss = 0.0
        for s in shard:
            toks = torch.tensor(s["tokens"])
            pred = self.model[1](self.model[0](toks).mean(0))
            loss = loss + (pred.squeeze() - s["reward"]) ** 2
        loss = loss / max(len(shard), 1)
        self.opt.zero_grad()
        loss.backward()
        for p in self.model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= self.world_size
        self.opt.step()
        return float(loss)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--fault-step", type=int, default=6)
    args = ap.parse_args()

    ray.init(address="local", num_cpus=3, include_dashboard=False,
             runtime_env={"env_vars": {k: v for k, v in os.environ.items() if k.startswith("HANGTRACE")}})
    # the malformed sample lands in step fault_step's batch (steps count from 1)
    bad = (args.fault_step - 1) * args.batch + 3
    rollout = RolloutWorker.options(name="rollout").remote(bad)
    port = free_port()
    trainers = [Trainer.options(name=f"trainer-{r}").remote(r, 2, port) for r in range(2)]
    ray.get([t.ready.remote() for t in trainers])
    ray.get(rollout.start.remote())
    print("actors ready", flush=True)

    for step in range(1, args.steps + 1):
        t0 = time.time()
        batch = ray.get(rollout.get_batch.remote(args.batch))
        losses = ray.get([t.train_step.remote(batch) for t in trainers])
        print(f"step {step} done loss {losses[0]:.4f} ({time.time() - t0:.2f}s)", flush=True)

    print("training finished", flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
