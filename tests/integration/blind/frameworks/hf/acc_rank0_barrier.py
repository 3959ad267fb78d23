"""Incident: the user saves an "unwrapped" checkpoint every 10 steps on the main process and,
to let the others wait for the file, calls `accelerator.wait_for_everyone()` - inside the
`if accelerator.is_main_process:` block. Rank 1 never calls it and goes on into step 11
(DDP's gradient all-reduce); rank 0 waits in a barrier rank 1 never issues.
Plain Accelerate (Accelerator(cpu=True)), `accelerate launch --multi_gpu --num_processes 2`,
gloo, DataLoader with 2 workers.
Expected: collective-mismatch (barrier vs all-reduce) or skipped-collective naming rank 0, at
`accelerator.wait_for_everyone()` in main.
"""
LAUNCH = "accelerate"
LAUNCHERS = ["accelerate"]
NPROC = 2
EXPECT = {"kind": ["collective-mismatch", "skipped-collective"], "culprit_ranks": [0], "where": "main"}

import os

import torch
import tempfile
from accelerate import Accelerator

from _acc_common import build_dataset, make_loader, make_model


def main():
    accelerator = Accelerator(cpu=True)
    ds = build_dataset(accelerator, "acc_rank0_barrier")
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
            if step % 10 == 0 and accelerator.is_main_process:
                ckpt = os.path.join(tempfile.gettempdir(), "ht-blind-acc", "acc_rank0_barrier", "model.pt")
                torch.save(accelerator.unwrap_model(model).state_dict(), ckpt)
                accelerator.wait_for_everyone()  # only rank 0 gets here
            if step == 40:
                break
    accelerator.wait_for_everyone()
    print(f"rank {accelerator.process_index} pid {os.getpid()} finished at step {step}", flush=True)
    accelerator.end_training()


if __name__ == "__main__":
    main()
