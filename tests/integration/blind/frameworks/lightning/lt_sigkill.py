"""Incident: rank 1 is SIGKILLed at step 10 (a host memory watchdog's `kill -9`; here a
"memory guard" Callback of rank 1 sends SIGKILL to its own process in
`on_train_batch_end`). No Python handler runs; rank 0 goes on into step 11's DDP gradient
all-reduce and fails there ("Connection closed by peer") or waits.
Lightning, `python job.py`, 2 CPU ranks, gloo, DataLoader with 2 workers (the killed rank's
workers are orphaned and exit when they notice).
Expected: dead-rank, rank 1, cause killed-without-record.
"""
LAUNCH = "python"
NPROC = 2
EXPECT = {"kind": "dead-rank", "culprit_ranks": [1], "cause": "killed-without-record"}

import os
import signal

from _lt_common import StepPrinter, TinyRegressor, make_trainer, pl


class MemoryGuard(pl.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        over_budget = trainer.global_rank == 1 and trainer.global_step == 10
        if over_budget:
            print(f"rank 1 pid {os.getpid()} over memory budget: kill -9", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


def main():
    trainer = make_trainer("lt_sigkill", callbacks=[StepPrinter(), MemoryGuard()])
    trainer.fit(TinyRegressor())
    print(f"rank {trainer.global_rank} pid {os.getpid()} finished", flush=True)


if __name__ == "__main__":
    main()
