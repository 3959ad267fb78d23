"""torch.multiprocessing.spawn job (the launcher's environment holds RANK=0, WORLD_SIZE=4, as
a cluster wrapper exports them); at the end of epoch 1 rank 0 saves a checkpoint, then calls a
"to be safe" ``dist.barrier()`` before it writes the marker file ranks 1-3 poll for with
``while not os.path.exists(marker): time.sleep(0.05)``: rank 0 waits in the barrier for ranks
that wait for a file rank 0 writes only after it.

Written blind on 2026-12-04 by a helper that had read only the README (helper 62; its
launcher and training module made one file here, the port chosen free). Its verdict named
ranks 1-3 "blocked in the system call clock_nanosleep" with generic advice, rank 0's line and
the cycle not named (fixed: analyze/pollwait.py).
"""
LAUNCH = "python"
NPROC = 4
EXPECT = {"kind": "stuck-outside-collective", "culprit_ranks": [1, 2, 3],
          "says": ["polling in a loop: `while not os.path.exists(marker):`", "Rank 0 waits for them in barrier",
                   "at save_checkpoint (sp_marker_barrier.py:", "this is a cycle"]}

import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class SyntheticDataset(Dataset):
    def __init__(self, n=512, dim=32):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, dim, generator=g)
        w = torch.randn(dim, 1, generator=g)
        self.y = self.x @ w + 0.1 * torch.randn(n, 1, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class MLP(nn.Module):
    def __init__(self, dim=32, hidden=64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, x):
        return self.net(x)


def log(rank, msg):
    print(f"[rank {rank}] {msg}", flush=True)


def save_checkpoint(rank, model, opt, epoch, ckpt_dir):
    path = os.path.join(ckpt_dir, f"ckpt_epoch{epoch}.pt")
    marker = os.path.join(ckpt_dir, f"ckpt_epoch{epoch}.done")
    if rank == 0:
        torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "epoch": epoch}, path)
        log(rank, f"wrote {path}")
        dist.barrier()  # "to be safe": make sure everyone is here before publishing
        with open(marker, "w") as f:
            f.write("ok\n")
        log(rank, f"wrote marker {marker}")
    return path, marker


def wait_for_checkpoint(rank, marker):
    log(rank, f"waiting for {marker}")
    while not os.path.exists(marker):
        time.sleep(0.05)
    log(rank, "marker found")


def evaluate(rank, path, dim=32):
    state = torch.load(path, map_location="cpu")
    m = MLP(dim)
    m.load_state_dict(state["model"])
    m.eval()
    ds = SyntheticDataset()
    with torch.no_grad():
        loss = nn.functional.mse_loss(m(ds.x), ds.y).item()
    log(rank, f"eval loss {loss:.4f}")


def worker(rank, world_size, ckpt_dir, epochs=3, steps_per_epoch=6):
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.manual_seed(rank)
    model = DDP(MLP())
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ds = SyntheticDataset()
    sampler = DistributedSampler(ds, num_replicas=world_size, rank=rank)
    loader = DataLoader(ds, batch_size=16, sampler=sampler, num_workers=2)
    for epoch in range(1, epochs + 1):
        sampler.set_epoch(epoch)
        t0 = time.time()
        for step, (x, y) in enumerate(loader):
            if step >= steps_per_epoch:
                break
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            l = loss.detach().clone()
            dist.all_reduce(l)
            if rank == 0:
                log(rank, f"epoch {epoch} step {step} loss {l.item() / world_size:.4f}")
        log(rank, f"epoch {epoch} done ({time.time() - t0:.2f}s)")
        path, marker = save_checkpoint(rank, model, opt, epoch, ckpt_dir)
        if rank != 0:
            wait_for_checkpoint(rank, marker)
            evaluate(rank, path)
    dist.destroy_process_group()


def main():
    import socket
    import tempfile

    import torch.multiprocessing as mp
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    os.environ.update(RANK="0", WORLD_SIZE="4", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    ckpt_dir = tempfile.mkdtemp(prefix="ckpt-")
    mp.spawn(worker, args=(4, ckpt_dir), nprocs=4, join=True)


if __name__ == "__main__":
    main()
