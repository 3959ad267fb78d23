"""Async trainer actors with helper threads; rank 1 blocks in queue.get() for a rollout that never comes.

Incident: two async Trainer actors (async def methods) form a gloo group. Each runs a background
"weight-sync-bookkeeper" thread. The driver hands out rollout batches per DP rank; at step 3 the
rollout returns too few samples and rank 1's share is empty, so nothing is pushed to it. Rank 1's
train_step blocks in queue.Queue.get() (on the actor's event-loop thread) and never reaches the
all_reduce that rank 0 is waiting in. A good tool: stuck-outside-collective, rank 1, blocked in
queue.get, not fooled by the bookkeeper threads or by the async event-loop thread layout.
"""
import os
import queue
import socket
import threading
import time
from datetime import timedelta

import ray

LAUNCH = "ray"
EXPECT = {"kind": "stuck-outside-collective", "culprit_ranks": [1], "culprit_actors": ["trainer-1"],
          "cause": "blocked"}


def tracing_env():
    return {k: v for k, v in os.environ.items() if k.startswith("HANGTRACE")}


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@ray.remote
class Trainer:
    def __init__(self, rank, world_size, master_addr, master_port):
        self.rank = rank
        os.environ.update(MASTER_ADDR=master_addr, MASTER_PORT=str(master_port),
                          RANK=str(rank), WORLD_SIZE=str(world_size))
        import torch
        import torch.distributed as dist
        dist.init_process_group("gloo", rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=90))
        torch.manual_seed(0)
        self.model = torch.nn.Linear(64, 64)
        self.rollouts = queue.Queue()
        self.weight_versions = []
        self._stop = False
        self.bookkeeper = threading.Thread(target=self._bookkeep, name="weight-sync-bookkeeper", daemon=True)
        self.bookkeeper.start()

    def _bookkeep(self):
        while not self._stop:
            self.weight_versions.append((time.time(), len(self.weight_versions)))
            self.weight_versions = self.weight_versions[-100:]
            time.sleep(0.5)

    async def ready(self):
        return os.getpid()

    async def push_rollout(self, batch):
        self.rollouts.put(batch)
        return self.rollouts.qsize()

    async def train_step(self, step):
        import torch
        import torch.distributed as dist
        try:
            from hangtrace import tracer
            tracer.step(step)
        except ImportError:
            pass
        batch = self.rollouts.get()  # blocks the event loop until a rollout arrives
        x = torch.tensor(batch, dtype=torch.float32).reshape(-1, 1).expand(-1, 64)
        loss = self.model(x).pow(2).mean()
        loss.backward()
        for p in self.model.parameters():
            dist.all_reduce(p.grad)
        return loss.item()


def rollout(step):
    n = 8 if step != 3 else 3  # at step 3 the rollout engine returns only 3 samples
    return [float(step + i) for i in range(n)]


def main():
    ray.init(address="local", num_cpus=4, include_dashboard=False, runtime_env={"env_vars": tracing_env()})
    port = free_port()
    trainers = [Trainer.options(name=f"trainer-{r}").remote(r, 2, "127.0.0.1", port) for r in range(2)]
    print(time.strftime("%H:%M:%S"), f"[driver] trainers up, pids {ray.get([t.ready.remote() for t in trainers], timeout=120)}", flush=True)
    try:
        for step in range(1, 7):
            samples = rollout(step)
            per_rank = 4
            for r, t in enumerate(trainers):
                share = samples[r * per_rank:(r + 1) * per_rank]
                if share:  # an empty share is simply not sent ...
                    ray.get(t.push_rollout.remote(share), timeout=30)
            losses = ray.get([t.train_step.remote(step) for t in trainers], timeout=120)
            print(time.strftime("%H:%M:%S"), f"[driver] step {step} loss {losses[0]:.4f}", flush=True)
    except Exception as e:  # noqa: BLE001
        print(time.strftime("%H:%M:%S"), f"[driver] training failed: {type(e).__name__}: {str(e)[:400]}", flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
