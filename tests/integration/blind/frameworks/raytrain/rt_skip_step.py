"""Ray Train V2: rank 1 skips an all-padding batch, so DDP's all-reduces misalign.

Incident (the "data-dependent `continue` in a DDP loop" bug, e.g. skipping a batch with no
valid tokens because `CrossEntropyLoss(ignore_index=-100)` returns NaN on it): the dataset
carries a block of padding rows (label -100) and the loop skips a batch whose labels are all
padding - `continue` before forward/backward and before `ray.train.report`. The loader is not
shuffled, so only rank 1's shard gets that block, as its 10th batch of every epoch (steps 10
and 25). Rank 1 therefore issues two fewer DDP gradient all-reduces (and two fewer reports)
than rank 0. gloo pairs rank 0's all-reduce of step k with rank 1's of step k+1 (same sizes:
no error, silently wrong gradients); rank 1 finishes its 28 steps and its training function
returns, while rank 0's 29th all-reduce waits for ever for a peer that is done. Ray Train's
controller sees one worker finished and one running, and keeps polling.

A correct tool: skipped-collective (or collective-mismatch) naming rank 1, the rank that
issued fewer collectives, at its `continue` in train_loop_per_worker; rank 0 waiting in
all_reduce is the cascade.
"""
import os
import tempfile
import time

import ray
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer

LAUNCH = "ray-train"
EXPECT = {"kind": "skipped-collective", "kind_also_right": ["collective-mismatch"],
          "culprit_ranks": [1], "line": "continue"}

EPOCHS = 2
N_SAMPLES = 480  # 240 per worker, 15 batches of 16 per epoch: 30 steps in all
BATCH = 16
IGNORE_INDEX = -100


def tracing_env():
    """What `hangtrace run` / HANGTRACE=1 put in our environment, for the Ray workers."""
    return {k: v for k, v in os.environ.items() if k.startswith("HANGTRACE")}


def make_labels(x, batch):
    """4 classes, and one block of padding rows (the tail of a packed file): with the
    unshuffled DistributedSampler, rank 1 reads rows 1, 3, 5, ..., so its 10th batch of each
    epoch is rows 2 * (batch * 9 + j) + 1 for j < batch."""
    y = (x[:, :4].sum(dim=1) > 0).long() + 2 * (x[:, 4] > 0).long()
    for j in range(batch):
        y[2 * (batch * 9 + j) + 1] = IGNORE_INDEX
    return y


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
    y = make_labels(x, config["batch"])
    loader = DataLoader(TensorDataset(x, y), batch_size=config["batch"], shuffle=False, num_workers=2)
    loader = ray.train.torch.prepare_data_loader(loader)

    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    model = ray.train.torch.prepare_model(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = nn.CrossEntropyLoss(ignore_index=IGNORE_INDEX)

    step = 0
    skipped = 0
    for epoch in range(config["epochs"]):
        if ctx.get_world_size() > 1:
            loader.sampler.set_epoch(epoch)
        for xb, yb in loader:
            step += 1
            if (yb == IGNORE_INDEX).all():
                skipped += 1
                continue  # nothing to learn from an all-padding batch (the loss would be NaN)
            loss = loss_fn(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            ray.train.report({"epoch": epoch, "step": step, "loss": loss.item()})
        print(f"[rank {rank}] epoch {epoch} done at step {step} ({skipped} batches skipped), "
              f"loss {loss.item():.4f}", flush=True)


def main():
    ray.init(address="local", num_cpus=4, include_dashboard=False,
             runtime_env={"env_vars": tracing_env()})
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"epochs": EPOCHS, "n_samples": N_SAMPLES, "batch": BATCH},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        torch_config=TorchConfig(backend="gloo"),
        run_config=RunConfig(name="rt_skip_step", storage_path=tempfile.mkdtemp(prefix="raytrain-")),
    )
    t0 = time.time()
    result = trainer.fit()
    print(f"[driver] fit() done in {time.time() - t0:.0f}s: {result.metrics}", flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
