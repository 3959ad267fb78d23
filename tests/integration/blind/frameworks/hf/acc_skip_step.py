"""Incident: the user's loop skips "corrupt" batches with `continue` before the forward pass
(a data-dependent check on the batch), counting the batch as a step anyway (the step is the
`enumerate` index). At step 10 rank 1's batch is judged corrupt, so rank 1 issues neither
that step's DDP gradient all-reduce nor its loss `gather`, while rank 0 does both; rank 1's
step-11 gradient all-reduce then meets rank 0's step-10 one (same size), and its step-12
all-reduce meets rank 0's `gather` - the ranks are one collective apart.
Plain Accelerate (Accelerator(cpu=True)), `accelerate launch --multi_gpu --num_processes 2`,
gloo, DataLoader with 2 workers.
Expected: skipped-collective or collective-mismatch naming rank 1, at the `continue` in main.
"""
LAUNCH = "accelerate"
LAUNCHERS = ["accelerate"]
NPROC = 2
EXPECT = {"kind": ["skipped-collective", "collective-mismatch"], "culprit_ranks": [1], "where": "main"}

import os

import torch
from accelerate import Accelerator

from _acc_common import build_dataset, make_loader, make_model


def corrupt(accelerator, step, x):
    return bool(torch.isnan(x).any()) or (accelerator.process_index == 1 and step == 10)


def main():
    accelerator = Accelerator(cpu=True)
    ds = build_dataset(accelerator, "acc_skip_step")
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt, loader = accelerator.prepare(model, opt, make_loader(ds))
    for step, (x, y) in enumerate(loader, start=1):
        if corrupt(accelerator, step, x):
            print(f"rank {accelerator.process_index} skipping a corrupt batch at step {step}", flush=True)
            continue
        loss = torch.nn.functional.cross_entropy(model(x), y)
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        if step % 5 == 0:
            mean = accelerator.gather(loss.detach()).mean()
            accelerator.print(f"step {step} loss {mean.item():.4f}")
        if step == 40:
            break
    accelerator.wait_for_everyone()
    print(f"rank {accelerator.process_index} pid {os.getpid()} finished", flush=True)
    accelerator.end_training()


if __name__ == "__main__":
    main()
