"""An async rollout actor's producer task raises; the trainer polls the queue forever.

Incident (async off-policy RL, AReaL/slime style): a Rollout actor (asyncio actor) starts a
background asyncio task, `asyncio.create_task(self._produce())`, that generates rollout batches
and puts them into a ray.util.queue.Queue with `await q.put_async(...)`. Nobody keeps or
awaits the task. At batch 7 the sampler hits an invalid probability tensor and the task raises
RuntimeError("probability tensor contains either inf, nan or element < 0"); the task dies,
the actor process stays alive and keeps answering status() calls. The Trainer actor (no rank,
no process group) polls the queue with q.get(timeout=2), logs "queue empty" on each Empty and
polls again, forever. The driver waits for trainer.train() (120 s timeout) and prints the
rollout's status every 20 s (its "running" flag is still True: the task's death went unseen).

EXPECTED verdict: kind dead-rank (the producer's work died with an exception; same shape as the
README's "producer whose background method raised"); culprit_ranks []; culprit_actors
Rollout 'rollout'; cause exception (the RuntimeError of the _produce task). The Trainer
'trainer' polling the empty queue, and the queue actor, are cascade.
"""
import asyncio
import os
import time

import ray
from ray.util.queue import Empty, Queue

LAUNCH = "ray"
EXPECT = {"kind": "dead-rank", "culprit_ranks": [], "culprit_actors": ["Rollout 'rollout'"],
          "cause": "exception"}

FAIL_AT = 7


def tracing_env():
    return {k: v for k, v in os.environ.items() if k.startswith("HANGTRACE")}


def log(msg):
    print(time.strftime("%H:%M:%S"), f"[driver] {msg}", flush=True)


@ray.remote
class Rollout:
    def __init__(self, q):
        import torch
        self.torch = torch
        self.q = q
        self.policy = torch.nn.Linear(16, 50)
        self.produced = 0
        self.running = False
        self.task = None

    async def start(self):
        self.running = True
        asyncio.create_task(self._produce())  # fire and forget
        return "started"

    async def _produce(self):
        torch = self.torch
        while self.running:
            await asyncio.sleep(0.5)  # decoding
            with torch.no_grad():
                logits = self.policy(torch.randn(4, 16))
                probs = torch.softmax(logits, dim=-1)
                if self.produced + 1 == FAIL_AT:
                    probs[1, 7] = float("nan")
                tokens = torch.multinomial(probs, num_samples=8)  # raises on NaN
            self.produced += 1
            await self.q.put_async({"batch": self.produced, "tokens": tokens.tolist()})
            print(f"[rollout] queued batch {self.produced}", flush=True)

    async def status(self):
        return {"running": self.running, "produced": self.produced}


@ray.remote
class Trainer:
    def __init__(self):
        import torch
        self.torch = torch
        self.model = torch.nn.Embedding(50, 8)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-3)

    def train(self, q, n_batches):
        torch = self.torch
        done = 0
        empty = 0
        while done < n_batches:
            try:
                batch = q.get(timeout=2)
            except Empty:
                empty += 1
                print(f"[trainer] queue empty ({empty} polls), trained {done}/{n_batches}", flush=True)
                continue
            tokens = torch.tensor(batch["tokens"])
            loss = self.model(tokens).pow(2).mean()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            done += 1
            print(f"[trainer] trained on batch {batch['batch']} loss {loss.item():.4f}", flush=True)
        return done


def main():
    ray.init(address="local", num_cpus=4, include_dashboard=False,
             runtime_env={"env_vars": tracing_env()})
    q = Queue(maxsize=4)
    rollout = Rollout.options(name="rollout").remote(q)
    trainer = Trainer.options(name="trainer").remote()
    log(f"rollout: {ray.get(rollout.start.remote(), timeout=120)}")
    ref = trainer.train.remote(q, 20)
    t0 = time.time()
    done = []
    while time.time() - t0 < 120:
        done, _ = ray.wait([ref], timeout=20)
        if done:
            break
        try:
            st = ray.get(rollout.status.remote(), timeout=10)
            log(f"waiting for trainer ({time.time() - t0:.0f}s); rollout status {st}")
        except Exception as e:  # noqa: BLE001
            log(f"rollout status failed: {type(e).__name__}")
    if done:
        log(f"trainer finished: {ray.get(ref)} batches")
    else:
        log("trainer did not finish within 120 s; giving up")
    ray.shutdown()
    log("shut down")


if __name__ == "__main__":
    main()
