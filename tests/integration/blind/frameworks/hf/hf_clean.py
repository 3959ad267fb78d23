"""Incident: none. A plain 40-step transformers.Trainer run of a tiny random GPT-2 (2 CPU
ranks, gloo, DataLoader with 2 workers, a loss log every 5 steps), which must end cleanly
with NO verdict from hangtrace. Run under torchrun and under
`accelerate launch --multi_gpu --num_processes 2` (in accelerate 1.16 `--cpu` with 2
processes starts ONE process; `use_cpu=True` keeps the job on the CPU).
"""
LAUNCH = "torchrun"
LAUNCHERS = ["torchrun", "accelerate"]
NPROC = 2
EXPECT = {"kind": None, "culprit_ranks": []}

import os

from _hf_common import make_trainer


def main():
    trainer = make_trainer("hf_clean")
    trainer.train()
    print(f"rank {trainer.args.process_index} pid {os.getpid()} finished at step {trainer.state.global_step}", flush=True)


if __name__ == "__main__":
    main()
