"""Incident: none. A plain 40-step Accelerate loop (Accelerator(cpu=True), 2 ranks via
`accelerate launch --multi_gpu --num_processes 2`, gloo, DataLoader with 2 workers,
`main_process_first()` around the dataset cache, a loss gather every 5 steps,
`wait_for_everyone()` at the end), which must end cleanly with NO verdict.
"""
LAUNCH = "accelerate"
LAUNCHERS = ["accelerate"]
NPROC = 2
EXPECT = {"kind": None, "culprit_ranks": []}

import os

import torch
from accelerate import Accelerator

from _acc_common import build_dataset, make_loader, make_model


def main():
    accelerator = Accelerator(cpu=True)
    ds = build_dataset(accelerator, "acc_clean")
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt, loader = accelerator.prepare(model, opt, make_loader(ds))
    step = 0
    while step < 40:
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
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
