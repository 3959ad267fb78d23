"""Ray Train V2: only rank 0 enters a `dist.barrier()` in its checkpoint helper.

Incident (a classic "rank-0-only" bug, e.g. the many `if rank == 0: save(); dist.barrier()`
reports): every 10 steps the loop saves a model snapshot. The author guarded the whole helper
with `if rank == 0:` to avoid every worker writing the file - including the
`dist.barrier()` meant to make the other workers wait until the file is complete. At step 10
rank 0 writes the file and waits in that barrier, which rank 1 never enters: rank 1 goes on to
`ray.train.report` and waits in Ray Train's own report synchronisation (a Ray actor, not a
torch collective) for rank 0, which never comes. Both actors are alive; nothing fails.

A correct tool: a collective that only rank 0 issued: skipped-collective (extra collective)
or collective-mismatch naming rank 0, in barrier, at the `dist.barrier()` line of
save_snapshot; rank 1 is the cascade (it never calls a barrier).
"""
import os
import tempfile
import time

import ray
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer

LAUNCH = "ray-train"
EXPECT = {"kind": "skipped-collective", "kind_also_right": ["collective-mismatch"],
          "culprit_ranks": [0], "line": "dist.barrier()"}

EPOCHS = 2
N_SAMPLES = 480  # 240 per worker, 15 batches of 16 per epoch: 30 steps in all
BATCH = 16
SNAPSHOT_EVERY = 10


def tracing_env():
    """What `hangtrace run` / HANGTRACE=1 put in our environment, for the Ray workers."""
    return {k: v for k, v in os.environ.items() if k.startswith("HANGTRACE")}


def save_snapshot(model, step, snap_dir):
    import torch
    import torch.distributed as dist

    path = os.path.join(snap_dir, f"model_step{step}.pt")
    torch.save(model.module.state_dict(), path + ".tmp")
    os.replace(path + ".tmp", path)
    dist.barrier()  # the others must not read the snapshot before it is complete
    return path


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
            loss = loss_fn(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if rank == 0 and step % SNAPSHOT_EVERY == 0:
                path = save_snapshot(model, step, config["snap_dir"])
                print(f"[rank 0] saved {path}", flush=True)
            ray.train.report({"epoch": epoch, "step": step, "loss": loss.item()})
        print(f"[rank {rank}] epoch {epoch} done at step {step}, loss {loss.item():.4f}", flush=True)


def main():
    ray.init(address="local", num_cpus=4, include_dashboard=False,
             runtime_env={"env_vars": tracing_env()})
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"epochs": EPOCHS, "n_samples": N_SAMPLES, "batch": BATCH,
                           "snap_dir": tempfile.mkdtemp(prefix="snapshots-")},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        torch_config=TorchConfig(backend="gloo"),
        run_config=RunConfig(name="rt_rank0_barrier", storage_path=tempfile.mkdtemp(prefix="raytrain-")),
    )
    t0 = time.time()
    result = trainer.fit()
    print(f"[driver] fit() done in {time.time() - t0:.0f}s: {result.metrics}", flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
