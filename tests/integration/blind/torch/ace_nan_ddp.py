"""Incident (ai2cm/ace #849): DDP training with a NaN-loss guard. At step 3 rank 1's batch
contains a NaN, its loss is NaN and the guard raises on rank 1 only, before backward; rank 0
(finite loss) enters loss.backward() and waits in DDP's gradient all-reduce (C++ reducer,
invisible to Python wrappers). The job hangs/dies with rank 0 blamed by the launcher.
torchrun, 2 ranks, DistributedDataParallel on CPU/gloo, DataLoader with 2 persistent workers.
"""
LAUNCH = "torchrun"
NPROC = 2
EXPECT = {"kind": "dead-rank", "culprit_ranks": [1], "cause": "exception"}

import datetime
import os
import threading
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class ClimateDataset(Dataset):
    def __init__(self, n=128):
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(n, 24, generator=g)
        self.x[4 * 8 + 3, 5] = float("nan")     # one bad sample; lands in rank 1's step-3 batch

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.x[i].roll(1)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"rank {rank} pid {os.getpid()} up", flush=True)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(24, 48), torch.nn.Tanh(), torch.nn.Linear(48, 24))
    model = DDP(net)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    ds = ClimateDataset()
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=False)
    loader = DataLoader(ds, batch_size=8, sampler=sampler, num_workers=2, persistent_workers=True)
    stop = threading.Event()
    threading.Thread(target=lambda: [print(f"[tb] rank {rank} flush", flush=True) for _ in iter(lambda: stop.wait(1.5), True)],
                     daemon=True).start()
    for step, (x, y) in enumerate(loader, start=1):
        loss = torch.nn.functional.mse_loss(model(x), y)
        if torch.isnan(loss):
            raise RuntimeError(f"Loss is NaN at step {step} (rank {rank}); aborting training")
        opt.zero_grad()
        loss.backward()            # DDP all-reduces gradients here
        opt.step()
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
        time.sleep(0.2)
        if step == 6:
            break
    stop.set()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
