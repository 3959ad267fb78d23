"""Incident: the user's `training_step` skips "bad" batches by returning None (Lightning's
documented way to skip a step in automatic optimisation; users miss that it is not
supported with DDP). At step 10 rank 1's batch is judged bad (a data-dependent check: here
the shard's position), so rank 1 would run no backward and issue no DDP gradient all-reduce
for that step while rank 0 does.
What really happens (seen on the first run, pytorch-lightning 2.6.6): Lightning itself
raises on rank 1, `RuntimeError: Skipping the training_step by returning None in distributed
training is not supported ...` (automatic.py), so this is a crash of rank 1, not a silent
skip; rank 0 then fails in its next collective ("Connection closed by peer").
The author's first expectation was skipped-collective [1]; the EXPECT below is what a correct
tool must say given that guard. `lt_uneven_shard.py` is the silent skip.
Lightning, `python job.py`, 2 CPU ranks, gloo, DataLoader with 2 workers.
Expected: dead-rank, rank 1, exception (Lightning's RuntimeError), caused by the
`return None` in SkipBadBatches.training_step.
"""
LAUNCH = "python"
NPROC = 2
EXPECT = {
    "kind": "dead-rank",
    "culprit_ranks": [1],
    "cause": "exception",
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
