"""Incident: a validation-of-outputs Callback raises on rank 1 at step 10
(`RuntimeError: loss spike on rank 1 ...`), as a user's sanity check would. Rank 1's
Lightning then runs its exception handling (`_call_and_handle_interrupt`: strategy
on_exception, teardown) and the process exits with the traceback, while rank 0 goes on into
step 11's DDP gradient all-reduce and fails or waits there.
Lightning, `python job.py`, 2 CPU ranks, gloo, DataLoader with 2 workers.
Expected: dead-rank, rank 1, cause exception (RuntimeError), raised at
`raise RuntimeError(...)` in SpikeGuard.on_train_batch_end.
"""
LAUNCH = "python"
NPROC = 2
EXPECT = {
    "kind": "dead-rank",
    "culprit_ranks": [1],
    "cause": "exception",
    "where": "on_train_batch_end",
}

import os

from _lt_common import StepPrinter, TinyRegressor, make_trainer, pl


class SpikeGuard(pl.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        loss = float(outputs["loss"])
        spike = trainer.global_rank == 1 and trainer.global_step == 10  # the data's bad shard
        if spike or loss != loss:
            raise RuntimeError(
                f"loss spike on rank {trainer.global_rank} at step {trainer.global_step}: {loss:.4f}"
            )


def main():
    trainer = make_trainer("lt_raise", callbacks=[StepPrinter(), SpikeGuard()])
    trainer.fit(TinyRegressor())
    print(f"rank {trainer.global_rank} pid {os.getpid()} finished", flush=True)


if __name__ == "__main__":
    main()
