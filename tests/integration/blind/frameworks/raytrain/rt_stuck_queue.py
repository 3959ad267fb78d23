"""Ray Train V2: rank 1 blocks for ever on a queue its refresher thread never fills.

Incident (the shape of many "one worker hangs, the others sit in NCCL/gloo" reports): every
worker runs a background thread that re-reads a label-remapping table from shared storage
every 10 steps and hands it to the training loop through a `queue.Queue`. On worker rank 1 the
read of the table hangs (a stale NFS handle; here a `threading.Event` that nobody sets), so at
step 10 its training loop blocks in `remap_q.get()` with no timeout - outside any collective.
Rank 0 got its table, runs step 10's forward/backward, and waits in DDP's gradient all-reduce
(C++, gloo's timeout is Ray Train's default 30 min) for rank 1. Ray Train's controller keeps
polling both workers: both actors are alive and healthy, so nothing ever fails.

A correct tool: stuck-outside-collective, culprit rank 1, blocked in `remap_q.get()` in
train_loop_per_worker (the user's line), with rank 0 waiting for it in all_reduce.
"""
import os
import queue
import tempfile
import threading
import time

import ray
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer

LAUNCH = "ray-train"
EXPECT = {"kind": "stuck-outside-collective", "culprit_ranks": [1], "cause": "blocked",
          "line": "remap_q.get()"}

EPOCHS = 2
N_SAMPLES = 480  # 240 per worker, 15 batches of 16 per epoch: 30 steps in all
BATCH = 16
REFRESH_EVERY = 10


def tracing_env():
    """What `hangtrace run` / HANGTRACE=1 put in our environment, for the Ray workers."""
    return {k: v for k, v in os.environ.items() if k.startswith("HANGTRACE")}


def read_remap_table(rank, version, storage_ok):
    """Stand-in for reading labels/remap_v{version}.json from shared storage."""
    if rank == 1 and version >= 1:
        storage_ok.wait()  # the NFS read that never returns on this node
    return {c: c for c in range(4)}


def remap_refresher(rank, remap_q, storage_ok):
    version = 0
    while True:
        remap_q.put(read_remap_table(rank, version, storage_ok))  # blocks while the loop has not taken the last one
        version += 1


def train_loop_per_worker(config):
    import torch
    import torch.nn as nn
    from torch.utils.data import DataLoader, TensorDataset

    import ray.train
    import ray.train.torch

    ctx = ray.train.get_context()
    rank = ctx.get_world_rank()

    g = torch.Generator().manual_seed(1234)
    x = torch.randn(config["n_samples"], 32, generator=g)
    y = (x[:, :4].sum(dim=1) > 0).long() + 2 * (x[:, 4] > 0).long()  # 4 classes
    loader = DataLoader(TensorDataset(x, y), batch_size=config["batch"], shuffle=True, num_workers=2)
    loader = ray.train.torch.prepare_data_loader(loader)

    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    model = ray.train.torch.prepare_model(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = nn.CrossEntropyLoss(ignore_index=-100)

    remap_q = queue.Queue(maxsize=1)
    storage_ok = threading.Event()
    threading.Thread(target=remap_refresher, args=(rank, remap_q, storage_ok),
                     name="remap-refresher", daemon=True).start()
    remap = remap_q.get()

    step = 0
    for epoch in range(config["epochs"]):
        if ctx.get_world_size() > 1:
            loader.sampler.set_epoch(epoch)
        for xb, yb in loader:
            step += 1
            if step % REFRESH_EVERY == 0:
                remap = remap_q.get()  # the fresh table; rank 1 waits here for ever
            yb = torch.tensor([remap[int(c)] for c in yb])
            loss = loss_fn(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            ray.train.report({"epoch": epoch, "step": step, "loss": loss.item()})
        print(f"[rank {rank}] epoch {epoch} done at step {step}, loss {loss.item():.4f}", flush=True)


def main():
    ray.init(address="local", num_cpus=4, include_dashboard=False,
             runtime_env={"env_vars": tracing_env()})
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"epochs": EPOCHS, "n_samples": N_SAMPLES, "batch": BATCH},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        torch_config=TorchConfig(backend="gloo"),
        run_config=RunConfig(name="rt_stuck_queue", storage_path=tempfile.mkdtemp(prefix="raytrain-")),
    )
    t0 = time.time()
    result = trainer.fit()
    print(f"[driver] fit() done in {time.time() - t0:.0f}s: {result.metrics}", flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
