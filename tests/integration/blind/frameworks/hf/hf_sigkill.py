"""Incident: rank 1 is SIGKILLed at step 10 (a host memory watchdog's `kill -9`; here a
"memory guard" TrainerCallback of rank 1 sends SIGKILL to its own process in
`on_step_end`). No Python handler runs. Rank 0 goes on into step 11 and fails in its next
collective ("Connection closed by peer"), or torchrun's agent notices the death first and
SIGTERMs rank 0.
transformers.Trainer, 2 CPU ranks, gloo, DataLoader with 2 workers; torchrun.
Expected: dead-rank, rank 1, cause killed-without-record.
"""
LAUNCH = "torchrun"
LAUNCHERS = ["torchrun"]
NPROC = 2
EXPECT = {"kind": "dead-rank", "culprit_ranks": [1], "cause": "killed-without-record"}

import os
import signal

from _hf_common import TrainerCallback, make_trainer


class MemoryGuard(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if args.process_index == 1 and state.global_step == 10:
            print(f"rank 1 pid {os.getpid()} over memory budget: kill -9", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


def main():
    trainer = make_trainer("hf_sigkill", callbacks=[MemoryGuard()])
    trainer.train()
    print(f"rank {trainer.args.process_index} pid {os.getpid()} finished", flush=True)


if __name__ == "__main__":
    main()
