"""A Ray Train V2 job (``TorchTrainer``, two CPU workers, gloo, ``prepare_model`` +
``prepare_data_loader`` with DataLoader workers, ``ray.train.report`` every step) for
tests/integration/test_raytrain.py. ``python raytrain_job.py MODE``:

* ``clean``: 12 steps, ``fit()`` returns, exit 0;
* ``stuck``: at step 4 rank 1 waits for ever on an event nobody sets, outside any collective
  (rank 0 waits for it in DDP's all-reduce; Ray Train's controller keeps polling both);
* ``raise``: at step 4 rank 1 raises ``RuntimeError("bad batch at step 4 on rank 1")`` in its
  training thread (Ray Train catches it; ``fit()`` raises; exit 1).

Prints ``STEP <rank> <n>`` lines; the HANGTRACE* variables go to the workers by ``runtime_env``.
"""

import os
import sys
import tempfile

import ray
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer


def train_func(config):
    import threading

    import torch
    import torch.nn as nn
    from torch.utils.data import DataLoader, TensorDataset

    import ray.train
    import ray.train.torch

    rank = ray.train.get_context().get_world_rank()
    x = torch.randn(192, 8, generator=torch.Generator().manual_seed(0))
    y = (x.sum(dim=1) > 0).long()
    loader = ray.train.torch.prepare_data_loader(
        DataLoader(TensorDataset(x, y), batch_size=16, num_workers=2)
    )
    model = ray.train.torch.prepare_model(nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    never = threading.Event()
    for step, (xb, yb) in enumerate(loader, 1):
        if step == 4 and rank == 1 and config["mode"] == "stuck":
            never.wait()  # outside any collective, for ever
        if step == 4 and rank == 1 and config["mode"] == "raise":
            raise RuntimeError("bad batch at step 4 on rank 1")
        loss = nn.functional.cross_entropy(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        ray.train.report({"step": step, "loss": loss.item()})
        print("STEP %d %d" % (rank, step), flush=True)


def main():
    mode = sys.argv[1]
    env = {k: v for k, v in os.environ.items() if k.startswith("HANGTRACE")}
    ray.init(address="local", num_cpus=4, include_dashboard=False, runtime_env={"env_vars": env})
    trainer = TorchTrainer(
        train_func,
        train_loop_config={"mode": mode},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        torch_config=TorchConfig(backend="gloo"),
        run_config=RunConfig(name="ht_" + mode, storage_path=tempfile.mkdtemp(prefix="ht-raytrain-")),
    )
    trainer.fit()
    print("FIT DONE", flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
