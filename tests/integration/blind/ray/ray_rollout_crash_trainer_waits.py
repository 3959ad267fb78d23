"""An async rollout worker crashes (segfault in its engine); the trainers wait on the rollout queue forever.

Incident (slime / AReaL-style async RL, verl's async rollout in spirit): a RolloutWorker actor
fills a ray.util.queue.Queue from a fire-and-forget generate_loop(). Its native engine segfaults
at the 2nd batch, so the worker process dies (Ray: SYSTEM_ERROR). Trainer rank 0 blocks in
queue.get() (a ray.get on the queue actor) for the next batch; trainer rank 1 waits in the
broadcast of that batch from rank 0. A good tool: dead-rank, the RolloutWorker actor (no rank),
cause fatal-signal (SIGSEGV), the trainers are cascade.
"""
import ctypes
import os
import socket
import time
from datetime import timedelta

import ray
from ray.util.queue import Queue

LAUNCH = "ray"
EXPECT = {"kind": "dead-rank", "culprit_ranks": [], "culprit_actors": ["rollout-0"],
          "cause": "fatal-signal"}


def tracing_env():
    return {k: v for k, v in os.environ.items() if k.startswith("HANGTRACE")}


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@ray.remote
class RolloutWorker:
    def generate_loop(self, q, n_batches):
        for b in range(n_batches):
            time.sleep(1.0)  # generation
            if b == 1:
                print("[rollout] engine: decoding batch 1 ...", flush=True)
                ctypes.string_at(0)  # the native engine dereferences NULL -> SIGSEGV
            q.put({"batch": b, "tokens": [b] * 16})
            print(f"[rollout] queued batch {b}", flush=True)
        return n_batches


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
        self.model = torch.nn.Linear(16, 1)

    def ready(self):
        return os.getpid()

    def train_step(self, step, q):
        import torch
        import torch.distributed as dist
        try:
            from hangtrace import tracer
            tracer.step(step)
        except ImportError:
            pass
        obj = [None]
        if self.rank == 0:
            obj[0] = q.get(block=True)  # wait for the next rollout batch
        dist.broadcast_object_list(obj, src=0)
        x = torch.tensor(obj[0]["tokens"], dtype=torch.float32).reshape(1, 16)
        loss = self.model(x).pow(2).mean()
        loss.backward()
        for p in self.model.parameters():
            dist.all_reduce(p.grad)
        return loss.item()


def main():
    ray.init(address="local", num_cpus=4, include_dashboard=False, runtime_env={"env_vars": tracing_env()})
    q = Queue(maxsize=4)
    port = free_port()
    trainers = [Trainer.options(name=f"trainer-{r}").remote(r, 2, "127.0.0.1", port) for r in range(2)]
    rollout = RolloutWorker.options(name="rollout-0").remote()
    print(time.strftime("%H:%M:%S"), f"[driver] trainers up, pids {ray.get([t.ready.remote() for t in trainers], timeout=120)}", flush=True)
    rollout.generate_loop.remote(q, 10)  # runs in the background
    try:
        for step in range(1, 6):
            losses = ray.get([t.train_step.remote(step, q) for t in trainers], timeout=120)
            print(time.strftime("%H:%M:%S"), f"[driver] step {step} loss {losses[0]:.4f}", flush=True)
    except Exception as e:  # noqa: BLE001
        print(time.strftime("%H:%M:%S"), f"[driver] training failed: {type(e).__name__}: {str(e)[:400]}", flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
