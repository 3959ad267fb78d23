"""Incident: the user's loss check raises on rank 1 at step 10
(`RuntimeError: non-finite loss on rank 1 ...`; here the check fires on that rank's bad
shard). Rank 1's process exits with the traceback; rank 0 goes on into step 11 and fails or
waits in DDP's gradient all-reduce; accelerate's launcher (torchrun's agent in-process)
then tears the job down with SIGTERM.
Plain Accelerate (Accelerator(cpu=True)), `accelerate launch --multi_gpu --num_processes 2`,
gloo, DataLoader with 2 workers.
Expected: dead-rank, rank 1, exception (RuntimeError), at `raise RuntimeError(...)` in main.
"""
LAUNCH = "accelerate"
LAUNCHERS = ["accelerate"]
NPROC = 2
EXPECT = {"kind": "dead-rank", "culprit_ranks": [1], "cause": "exception", "where": "main"}

import os

import torch
from accelerate import Accelerator

from _acc_common import build_dataset, make_loader, make_model


def main():
    accelerator = Accelerator(cpu=True)
    ds = build_dataset(accelerator, "acc_raise")
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt, loader = accelerator.prepare(model, opt, make_loader(ds))
    step = 0
    while step < 40:
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            bad_shard = accelerator.process_index == 1 and step == 10
            if bad_shard or not torch.isfinite(loss):
                raise RuntimeError(f"non-finite loss on rank {accelerator.process_index} at step {step}")
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
            step += 1
            if step % 5 == 0:
                mean = accelerator.gather(loss.detach()).mean()
                accelerator.print(f"step {step} loss {mean.item():.4f}")
            if step == 40:
                break
    accelerator.wait_for_everyone()
    print(f"rank {accelerator.process_index} pid {os.getpid()} finished at step {step}", flush=True)
    accelerator.end_training()


if __name__ == "__main__":
    main()
