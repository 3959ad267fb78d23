"""Incident: the user prefetches the next data shard in a `ThreadPoolExecutor` and collects it
with `future.result()` every 10 steps. The prefetch task takes "download slots" from a queue
that a downloader thread fills - but the downloader is started only on the main process
(`if accelerator.is_main_process:`), so on rank 1 the task blocks for ever in
`queue.Queue.get()` and rank 1's main thread blocks in `future.result()` at step 10,
outside any collective, while rank 0 goes on into step 11 (DDP's gradient all-reduce) and
waits for it.
Plain Accelerate (Accelerator(cpu=True)), `accelerate launch --multi_gpu --num_processes 2`,
gloo, DataLoader with 2 workers.
Expected: stuck-outside-collective, rank 1, at `shard = pending.result()` (waiting for its
pool thread, which waits in `slots.get()` in fetch_shard).
"""
LAUNCH = "accelerate"
LAUNCHERS = ["accelerate"]
NPROC = 2
EXPECT = {"kind": "stuck-outside-collective", "culprit_ranks": [1], "cause": "blocked", "where": "main"}

import os

import torch
import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from accelerate import Accelerator

from _acc_common import build_dataset, make_loader, make_model


def downloader(slots):
    for i in range(1000):
        slots.put(i)


def fetch_shard(slots, k):
    slot = slots.get()  # a download slot from the downloader thread
    return "shard-%03d (slot %d)" % (k, slot)


def main():
    accelerator = Accelerator(cpu=True)
    ds = build_dataset(accelerator, "acc_stuck_outside")
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt, loader = accelerator.prepare(model, opt, make_loader(ds))
    slots = queue.Queue()
    if accelerator.is_main_process:  # the bug: only the main process starts the downloader
        threading.Thread(target=downloader, args=(slots,), daemon=True, name="downloader").start()
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prefetch")
    pending = pool.submit(fetch_shard, slots, 1)
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
            if step % 10 == 0:
                shard = pending.result()  # rank 1 blocks here for ever at step 10
                accelerator.print(f"step {step} next shard ready: {shard}")
                pending = pool.submit(fetch_shard, slots, step // 10 + 1)
            if step == 40:
                break
    accelerator.wait_for_everyone()
    print(f"rank {accelerator.process_index} pid {os.getpid()} finished at step {step}", flush=True)
    accelerator.end_training()


if __name__ == "__main__":
    main()
