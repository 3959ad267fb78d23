"""Incident: rank 1 is SIGKILLed at step 10 (a host memory watchdog's `kill -9`; here the
user's "memory guard" in the loop of rank 1 sends SIGKILL to its own process). No Python
handler runs; rank 0 fails in its next collective or accelerate's launcher (torchrun's
agent) notices the death and SIGTERMs it.
Plain Accelerate (Accelerator(cpu=True)), `accelerate launch --multi_gpu --num_processes 2`,
gloo, DataLoader with 2 workers.
Expected: dead-rank, rank 1, killed-without-record.
"""
LAUNCH = "accelerate"
LAUNCHERS = ["accelerate"]
NPROC = 2
EXPECT = {"kind": "dead-rank", "culprit_ranks": [1], "cause": "killed-without-record"}

import os

import torch
import signal
from accelerate import Accelerator

from _acc_common import build_dataset, make_loader, make_model


def main():
    accelerator = Accelerator(cpu=True)
    ds = build_dataset(accelerator, "acc_sigkill")
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
            if accelerator.process_index == 1 and step == 10:  # over the memory budget
                print(f"rank 1 pid {os.getpid()} over memory budget: kill -9", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            if step == 40:
                break
    accelerator.wait_for_everyone()
    print(f"rank {accelerator.process_index} pid {os.getpid()} finished at step {step}", flush=True)
    accelerator.end_training()


if __name__ == "__main__":
    main()
