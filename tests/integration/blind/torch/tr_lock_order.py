"""RL trainer shard: rank 1's main loop and its weight-pusher thread take two locks in
opposite orders (a lock-order deadlock); rank 0 waits in all_reduce.

Written blind on 2026-12-04 by a helper that had read only the README (helper 53), from the
incident: "2-rank torchrun job, DataLoader workers; a background thread pushes weights to an
inference server taking weights_lock then metrics_lock; the main loop's logging takes
metrics_lock then weights_lock; around step 6 on rank 1 they deadlock; rank 0 sits in
all_reduce." Its verdict was right (both threads, both lines); since then the verdict also
says which lock each holds (the `with` blocks it is inside).
"""
LAUNCH = "torchrun"
NPROC = 2
EXPECT = {"kind": "stuck-outside-collective", "culprit_ranks": [1],
          "says": ["`with weights_lock:`", "'weight-pusher'", "`with metrics_lock:`", "lock-order deadlock"]}

import os
import queue
import threading
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

from hangtrace import tracer

PUSH_EVERY = 2        # push weights to the inference server every N steps
LOG_EVERY = 6         # local data-pipeline log (last rank only)
MAX_STEPS = 40

weights_lock = threading.Lock()   # guards the model parameters / weight version
metrics_lock = threading.Lock()   # guards the metrics dict
metrics = {"pushes": 0, "last_push_s": 0.0, "loss": float("nan"), "samples": 0}
weight_version = 0
push_started = threading.Event()


class RolloutBuffer(Dataset):
    """Fake rollout data: (obs, return) pairs."""

    def __init__(self, n=4096, dim=32, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, dim, generator=g)
        w = torch.randn(dim, 1, generator=g)
        self.y = self.x @ w + 0.1 * torch.randn(n, 1, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class ValueNet(nn.Module):
    def __init__(self, dim=32):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, 128), nn.Tanh(), nn.Linear(128, 128),
                                 nn.Tanh(), nn.Linear(128, 1))

    def forward(self, x):
        return self.net(x)


def weight_pusher(model, requests, rank):
    """Background thread: snapshot weights and push them to the inference server."""
    global weight_version
    while True:
        step = requests.get()
        if step is None:
            return
        t0 = time.time()
        with weights_lock:
            push_started.set()
            state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            weight_version += 1
            time.sleep(0.5)  # simulated HTTP push of `state` to the inference server
            with metrics_lock:
                metrics["pushes"] += 1
                metrics["last_push_s"] = time.time() - t0
        print(f"[rank {rank}] pushed weights v{weight_version} at step {step}", flush=True)


def log_pipeline_stats(rank, step):
    """Only the last rank logs data-pipeline stats (it owns the local logger)."""
    with metrics_lock:
        samples = metrics["samples"]
        loss = metrics["loss"]
        time.sleep(0.05)  # format / write the log line
        with weights_lock:
            v = weight_version
        print(f"[rank {rank}] step {step} loss {loss:.4f} samples {samples} weights v{v}",
              flush=True)


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)

    model = ValueNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ds = RolloutBuffer(seed=rank)
    loader = DataLoader(ds, batch_size=32, shuffle=True, num_workers=2,
                        persistent_workers=True)

    requests = queue.Queue()
    pusher = threading.Thread(target=weight_pusher, args=(model, requests, rank),
                              name="weight-pusher", daemon=True)
    pusher.start()

    step = 0
    it = iter(loader)
    while step < MAX_STEPS:
        step += 1
        tracer.step(step)
        with tracer.phase("data"):
            try:
                x, y = next(it)
            except StopIteration:
                it = iter(loader)
                x, y = next(it)

        with tracer.phase("train"):
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
            dist.all_reduce(flat)
            flat /= world
            off = 0
            for p in model.parameters():
                n = p.numel()
                p.grad.copy_(flat[off:off + n].view_as(p.grad))
                off += n
            with weights_lock:
                opt.step()
            l = loss.detach().clone()
            dist.all_reduce(l)
            l /= world

        with metrics_lock:
            metrics["loss"] = l.item()
            metrics["samples"] += x.shape[0] * world

        if step % PUSH_EVERY == 0:
            with tracer.phase("push_weights"):
                push_started.clear()
                requests.put(step)

        if rank == world - 1 and step % LOG_EVERY == 0:
            with tracer.phase("log"):
                # make sure the push has begun so the log reports the version in flight
                push_started.wait(timeout=5)
                log_pipeline_stats(rank, step)

        if rank == 0:
            print(f"[rank 0] step {step} loss {l.item():.4f}", flush=True)

    requests.put(None)
    pusher.join()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
