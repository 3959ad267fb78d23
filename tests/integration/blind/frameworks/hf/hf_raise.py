"""Incident: a TrainerCallback's sanity check raises on rank 1 at step 10
(`RuntimeError: grad norm exploded on rank 1 ...`). The exception leaves `trainer.train()`
and rank 1's process exits with the traceback; rank 0 goes on into step 11 and fails (or
waits) in the Trainer's next collective; the launcher (torchrun's agent, or accelerate's)
then tears the job down with SIGTERM.
transformers.Trainer, 2 CPU ranks, gloo, DataLoader with 2 workers; torchrun and
`accelerate launch`.
Expected: dead-rank, rank 1, cause exception (RuntimeError), at `raise RuntimeError(...)` in
GradGuard.on_step_end.
"""
LAUNCH = "torchrun"
LAUNCHERS = ["torchrun", "accelerate"]
NPROC = 2
EXPECT = {
    "kind": "dead-rank",
    "culprit_ranks": [1],
    "cause": "exception",
    "where": "on_step_end",
}

import os

from _hf_common import TrainerCallback, make_trainer


class GradGuard(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        exploded = args.process_index == 1 and state.global_step == 10  # this rank's bad shard
        if exploded:
            raise RuntimeError(f"grad norm exploded on rank {args.process_index} at step {state.global_step}")


def main():
    trainer = make_trainer("hf_raise", callbacks=[GradGuard()])
    trainer.train()
    print(f"rank {trainer.args.process_index} pid {os.getpid()} finished", flush=True)


if __name__ == "__main__":
    main()
