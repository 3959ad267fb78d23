"""Incident: a user's "export the model for the demo" Callback. Every 10 steps rank 0 (and
only rank 0, `if trainer.is_global_zero:`) writes a TorchScript export, and "to be safe so
the other ranks don't read a half-written file" calls `trainer.strategy.barrier()` inside
that `if`. Rank 1 never calls the barrier: it goes on into step 11, whose backward issues
DDP's gradient all-reduce. Rank 0 sits in the barrier (a collective rank 1 never issues),
rank 1 in the all-reduce.
Lightning, `python job.py`, 2 CPU ranks, gloo, DataLoader with 2 workers.
Expected: a collective mismatch (barrier vs all-reduce at one sequence number) or a skipped
collective, naming rank 0 (the rank that issued the extra barrier), at
`trainer.strategy.barrier("export")` in ExportCallback.on_train_batch_end.
"""
LAUNCH = "python"
NPROC = 2
EXPECT = {
    "kind": ["collective-mismatch", "skipped-collective"],
    "culprit_ranks": [0],
    "where": "on_train_batch_end",
}

import os
import tempfile

import torch

from _lt_common import StepPrinter, TinyRegressor, make_trainer, pl


class ExportCallback(pl.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step % 10 == 0 and trainer.is_global_zero:
            path = os.path.join(tempfile.gettempdir(), "ht-blind-lightning", "export.pt")
            torch.jit.trace(pl_module.net, torch.randn(1, 32)).save(path)
            print(f"rank 0 exported {path} at step {trainer.global_step}", flush=True)
            trainer.strategy.barrier("export")  # only rank 0 gets here


def main():
    trainer = make_trainer("lt_rank0_barrier", callbacks=[StepPrinter(), ExportCallback()])
    trainer.fit(TinyRegressor())
    print(f"rank {trainer.global_rank} pid {os.getpid()} finished", flush=True)


if __name__ == "__main__":
    main()
