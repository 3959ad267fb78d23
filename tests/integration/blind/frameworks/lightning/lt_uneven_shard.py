"""Incident: the user shards the data per rank themselves (pre-sharded files, so
`use_distributed_sampler=False`, one epoch) and the shards are not the same size: rank 0's
shard holds 320 samples (40 batches of 8), rank 1's 312 (39 batches). With
`max_steps=40, max_epochs=1`, rank 1's epoch - and its `fit` - ends after step 39 and it
goes into Lightning's end-of-fit teardown, while rank 0 runs step 40 and waits in DDP's
gradient all-reduce (and the per-step broadcast) that rank 1 never issues. The classic
"uneven inputs" hang of DDP.
Lightning, `python job.py`, 2 CPU ranks, gloo, DataLoader with 2 workers.
Expected: skipped-collective (or collective-mismatch) naming rank 1, the rank that left its
loop one step early (its loop ran out of data in the DataLoader iteration of
`_TrainingEpochLoop`).
"""
LAUNCH = "python"
NPROC = 2
EXPECT = {
    "kind": ["skipped-collective", "collective-mismatch"],
    "culprit_ranks": [1],
}

import os

import torch
from torch.utils.data import DataLoader, Dataset

from _lt_common import StepPrinter, TinyRegressor, pl, DDPStrategy
import tempfile


class ShardDataset(Dataset):
    """This rank's pre-sharded file (here generated): 320 samples on rank 0, 312 on rank 1."""

    def __init__(self, rank, dim=32):
        n = 320 if rank == 0 else 312
        g = torch.Generator().manual_seed(rank)
        self.x = torch.randn(n, dim, generator=g)
        self.y = torch.randn(n, 1, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class ShardedRegressor(TinyRegressor):
    def train_dataloader(self):
        ds = ShardDataset(self.trainer.global_rank)
        return DataLoader(ds, batch_size=8, shuffle=True, num_workers=2, persistent_workers=True)


def main():
    root = os.path.join(tempfile.gettempdir(), "ht-blind-lightning", "lt_uneven_shard")
    os.makedirs(root, exist_ok=True)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=DDPStrategy(process_group_backend="gloo"),
        max_steps=40,
        max_epochs=1,
        use_distributed_sampler=False,  # the data is already sharded per rank
        callbacks=[StepPrinter()],
        default_root_dir=root,
        enable_checkpointing=False,
        enable_progress_bar=False,
        logger=False,
    )
    trainer.fit(ShardedRegressor())
    print(f"rank {trainer.global_rank} pid {os.getpid()} finished at step {trainer.global_step}", flush=True)


if __name__ == "__main__":
    main()
