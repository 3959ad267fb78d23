"""Incident: none. A plain 40-step Lightning DDP run (2 CPU ranks, gloo, DataLoader with 2
workers), which must end cleanly with NO verdict from hangtrace (a false alarm here would be
a bug: Lightning's own start-up, its subprocess launcher and its teardown barriers must not
look like a hang or a death).
"""
LAUNCH = "python"
NPROC = 2
EXPECT = {"kind": None, "culprit_ranks": []}

import os

from _lt_common import StepPrinter, TinyRegressor, make_trainer


def main():
    trainer = make_trainer("lt_clean", callbacks=[StepPrinter()])
    trainer.fit(TinyRegressor())
    print(f"rank {trainer.global_rank} pid {os.getpid()} finished at step {trainer.global_step}", flush=True)


if __name__ == "__main__":
    main()
