"""Incident: the user's `training_step` skips "bad" batches by returning None (Lightning's
documented way to skip a step in automatic optimisation; its docs warn this is not
supported with DDP, which users miss). At step 10 rank 1's batch is judged bad (a
data-dependent check: here the shard's sample ids), so rank 1 runs no backward and issues
no DDP gradient all-reduce for that step, while rank 0 does. From then on rank 1 is one
gradient all-reduce behind rank 0 (gloo pairs rank 0's step-10 all-reduce with rank 1's
step-11 one, same sizes), and at the end of training rank 0 waits in its last gradient
all-reduce while rank 1 has none left (it goes on into Lightning's teardown).
Lightning, `python job.py`, 2 CPU ranks, gloo, DataLoader with 2 workers.
Expected: skipped-collective (or collective-mismatch) naming rank 1, at the `return None`
in SkipBadBatches.training_step.
"""
LAUNCH = "python"
NPROC = 2
EXPECT = {
    "kind": ["skipped-collective", "collective-mismatch"],
    "culprit_ranks": [1],
    "where": "training_step",
}

import os

import torch

from _lt_common import StepPrinter, TinyRegressor, make_trainer


class SkipBadBatches(TinyRegressor):
    def training_step(self, batch, batch_idx):
        x, y = batch
        if self.global_rank == 1 and self.trainer.global_step == 10:  # "all-padding batch"
            print(f"rank 1 skipping a bad batch at step {self.trainer.global_step}", flush=True)
            return None
        loss = torch.nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss)
        return loss


def main():
    trainer = make_trainer("lt_skip_step", callbacks=[StepPrinter()])
    trainer.fit(SkipBadBatches())
    print(f"rank {trainer.global_rank} pid {os.getpid()} finished at step {trainer.global_step}", flush=True)


if __name__ == "__main__":
    main()
