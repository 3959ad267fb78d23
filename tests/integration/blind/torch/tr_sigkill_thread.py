"""Incident: rank 1 is SIGKILLed mid-training (as a host OOM killer or an external
`kill -9` would do; here a background "memory guard" thread of rank 1 sends SIGKILL to its
own process at step 3). No Python handler runs. Rank 0 then fails in its next all_reduce
with a connection error (cascade). torchrun, 2 ranks, DataLoader with 2 persistent workers;
uninstrumented.
"""
LAUNCH = "torchrun"
NPROC = 2
EXPECT = {"kind": "dead-rank", "culprit_ranks": [1], "cause": "killed-without-record"}

import datetime
import os
import signal
import threading
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset


class DS(Dataset):
    def __len__(self):
        return 200

    def __getitem__(self, i):
        return torch.randn(32), torch.randn(1)


def memory_guard(rank, state):
    while True:
        time.sleep(0.05)
        if rank == 1 and state["step"] == 3:
            print(f"rank {rank} memory guard: over budget, kill -9", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank = dist.get_rank()
    print(f"rank {rank} pid {os.getpid()} up", flush=True)
    model = torch.nn.Linear(32, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    state = {"step": 0}
    threading.Thread(target=memory_guard, args=(rank, state), daemon=True).start()
    loader = DataLoader(DS(), batch_size=8, num_workers=2, persistent_workers=True)
    for step, (x, y) in enumerate(loader, start=1):
        state["step"] = step
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        time.sleep(0.3)                    # "compute"
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
        if step == 6:
            break
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
