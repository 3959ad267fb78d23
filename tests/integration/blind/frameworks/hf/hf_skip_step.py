"""Incident: the user subclasses transformers.Trainer and overrides `training_step` to skip
batches whose labels are all masked (a data-dependent early return that "avoids a NaN
loss"): it returns a zero loss without calling backward. At step 10 rank 1's batch is
judged empty (here: by the shard's position), so rank 1 issues no DDP gradient all-reduce
for that step while rank 0 does. Rank 1 then goes on into step 11, whose first collective is
the Trainer's own all_gather of the token count (`average_tokens_across_devices`), and meets
rank 0's gradient all-reduce there.
transformers.Trainer, 2 CPU ranks, gloo, DataLoader with 2 workers; torchrun.
Expected: skipped-collective or collective-mismatch naming rank 1, at the early `return` in
SkipEmptyTrainer.training_step.
"""
LAUNCH = "torchrun"
LAUNCHERS = ["torchrun"]
NPROC = 2
EXPECT = {
    "kind": ["skipped-collective", "collective-mismatch"],
    "culprit_ranks": [1],
    "where": "training_step",
}

import os

import torch

from _hf_common import Trainer, make_trainer


class SkipEmptyTrainer(Trainer):
    def training_step(self, model, inputs, num_items_in_batch=None):
        labels = inputs["labels"]
        all_masked = bool((labels == -100).all())
        if all_masked or (self.args.process_index == 1 and self.state.global_step == 9):
            print(f"rank {self.args.process_index} skipping an empty batch at step {self.state.global_step + 1}", flush=True)
            return torch.tensor(0.0)
        return super().training_step(model, inputs, num_items_in_batch)


def main():
    trainer = make_trainer("hf_skip_step", trainer_cls=SkipEmptyTrainer)
    trainer.train()
    print(f"rank {trainer.args.process_index} pid {os.getpid()} finished", flush=True)


if __name__ == "__main__":
    main()
