"""Ray Train V2: rank 1 raises RuntimeError on a non-finite loss at step 10.

Incident (ai2cm/ace-style NaN guards, the "worker raised, job torn down" case): the loop
checks the loss before backward and raises on a non-finite one. Rank 1's shard has a corrupt
record that shows up in its batch at step 10 (here: one feature set to NaN), so rank 1 raises
`RuntimeError("non-finite loss nan at step 10 on rank 1: corrupt record in this shard")` in
its training thread (Ray Train V2 runs `train_loop_per_worker` in a thread of the worker
actor). Rank 0 is in step 10's DDP gradient all-reduce, waiting for rank 1. Ray Train's
controller sees rank 1's error at its next poll (every 2 s) and, with the default
`FailureConfig(max_failures=0)`, shuts the worker group down; `trainer.fit()` raises in the
driver, which exits non-zero.

A correct tool: dead-rank, cause exception, culprit rank 1, quoting the RuntimeError's message
and the `raise RuntimeError(` line in train_loop_per_worker; rank 0 (waiting in all_reduce,
then torn down by Ray Train) is not the cause.
"""
import os
import tempfile
import time

import ray
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer

LAUNCH = "ray-train"
EXPECT = {"kind": "dead-rank", "culprit_ranks": [1], "cause": "exception",
          "summary_has": "non-finite loss nan at step 10 on rank 1",
          "line": "raise RuntimeError("}

EPOCHS = 2
N_SAMPLES = 480  # 240 per worker, 15 batches of 16 per epoch: 30 steps in all
BATCH = 16
BAD_STEP = 10


def tracing_env():
    """What `hangtrace run` / HANGTRACE=1 put in our environment, for the Ray workers."""
    return {k: v for k, v in os.environ.items() if k.startswith("HANGTRACE")}


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

    step = 0
    for epoch in range(config["epochs"]):
        if ctx.get_world_size() > 1:
            loader.sampler.set_epoch(epoch)
        for xb, yb in loader:
            step += 1
            if rank == 1 and step == BAD_STEP:
                xb[0, 3] = float("nan")  # stand-in for the corrupt record in rank 1's shard
            loss = loss_fn(model(xb), yb)
            if not torch.isfinite(loss):
                raise RuntimeError(
                    f"non-finite loss {loss.item()} at step {step} on rank {rank}: corrupt record in this shard")
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
        run_config=RunConfig(name="rt_raise", storage_path=tempfile.mkdtemp(prefix="raytrain-")),
    )
    t0 = time.time()
    result = trainer.fit()
    print(f"[driver] fit() done in {time.time() - t0:.0f}s: {result.metrics}", flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
