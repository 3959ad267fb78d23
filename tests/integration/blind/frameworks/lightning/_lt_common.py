"""Shared set-up of the blind Lightning jobs (not a job: no EXPECT). A tiny regression
model on random tensors, a DataLoader with 2 workers, and the Trainer every user writes:
``Trainer(accelerator="cpu", devices=2, strategy=DDPStrategy(process_group_backend="gloo"),
max_steps=40)``, started with plain ``python job.py`` (Lightning re-runs the script for
rank 1 with its own subprocess launcher)."""

import os
import tempfile

import torch
from torch.utils.data import DataLoader, Dataset

try:
    import lightning.pytorch as pl  # the unified package, when installed
    from lightning.pytorch.strategies import DDPStrategy
except ImportError:  # pytorch-lightning
    import pytorch_lightning as pl
    from pytorch_lightning.strategies import DDPStrategy


class RandomRegression(Dataset):
    def __init__(self, n=2048, dim=32):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, dim, generator=g)
        self.y = torch.randn(n, 1, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class TinyRegressor(pl.LightningModule):
    def __init__(self, dim=32, hidden=64):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(dim, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1)
        )

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        return DataLoader(
            RandomRegression(), batch_size=8, shuffle=True, num_workers=2, persistent_workers=True
        )


def make_trainer(name, callbacks=(), max_steps=40):
    root = os.path.join(tempfile.gettempdir(), "ht-blind-lightning", name)
    os.makedirs(root, exist_ok=True)
    return pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=DDPStrategy(process_group_backend="gloo"),
        max_steps=max_steps,
        callbacks=list(callbacks),
        default_root_dir=root,
        enable_checkpointing=False,
        enable_progress_bar=False,
        log_every_n_steps=5,
        logger=False,
    )


class StepPrinter(pl.Callback):
    """Prints each rank's step, as a user's logging would."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step % 5 == 0:
            print(f"rank {trainer.global_rank} pid {os.getpid()} step {trainer.global_step}", flush=True)
