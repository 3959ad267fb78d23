"""torch.multiprocessing.spawn job (the launcher's environment holds RANK=0, WORLD_SIZE=2, as a
cluster wrapper exports them); each rank's background thread 'metrics-sync' all-reduces an
8-float metrics tensor every 0.5 s on the default group while the main thread all-reduces the
loss (1 float) each step on the same group. Rank 1's thread waits 0.2 s longer, so rank 0's
thread goes first while rank 1's main thread does: at one sequence number the ranks pair an
all_reduce of 8 floats with one of 1, and gloo aborts the rank with the smaller tensor.

Written blind on 2026-12-04 by a helper that had read only the README (helper 67; launcher and
training module made one file here, the port chosen free). Its verdict named the mismatched
pair and rank 0, but not the thread (the records held thread=metrics-sync) and showed the main
thread's frames (fixed: analyze/threadgroups.py).
"""
LAUNCH = "python"
NPROC = 2
EXPECT = {"kind": "collective-mismatch", "culprit_ranks": [0],
          "says": ["from 2 threads (its main thread, 'metrics-sync')", "came from its thread 'metrics-sync'",
                   "Next: issue each process group's collectives from one thread"]}


import os
import threading
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class SyntheticRegression(Dataset):
    def __init__(self, n=4096, dim=32, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, dim, generator=g)
        w = torch.randn(dim, 1, generator=g)
        self.y = self.x @ w + 0.1 * torch.randn(n, 1, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        # a bit of "decoding" work per sample
        time.sleep(0.0005)
        return self.x[i], self.y[i]


class MLP(nn.Module):
    def __init__(self, dim=32, hidden=128):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(dim, hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.ReLU(),
            nn.Linear(hidden, 1),
        )

    def forward(self, x):
        return self.net(x)


class MetricsState:
    """Running metrics the background thread syncs across ranks."""

    def __init__(self):
        self.lock = threading.Lock()
        self.vals = torch.zeros(8)

    def update(self, loss, grad_norm, lr, n):
        with self.lock:
            self.vals[0] += loss
            self.vals[1] += grad_norm
            self.vals[2] = lr
            self.vals[3] += n
            self.vals[4] = max(float(self.vals[4]), loss)
            self.vals[5] += 1
            # 6,7: reserved (throughput, data wait)

    def snapshot(self):
        with self.lock:
            return self.vals.clone()


def metrics_sync_loop(rank, state, stop_evt, period):
    step = 0
    while not stop_evt.is_set():
        time.sleep(period)
        if stop_evt.is_set():
            break
        t = state.snapshot()
        # our logger formats a few extra fields on rank != 0 before syncing
        if rank != int(os.environ.get("METRICS_FAST_RANK", "0")):
            time.sleep(0.2)
        dist.all_reduce(t)  # default group, same as the main thread's loss all_reduce
        step += 1
        if rank == 0:
            ws = dist.get_world_size()
            print(f"[metrics-sync] sync {step}: mean loss sum {t[0].item() / ws:.3f}, "
                  f"samples {int(t[3].item())}", flush=True)


def worker(rank, world_size, epochs):
    # The cluster wrapper exported MASTER_ADDR/MASTER_PORT (and RANK=0, WORLD_SIZE=2
    # for the launcher); we pass rank/world_size explicitly.
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.manual_seed(1234 + rank)
    print(f"rank {rank} ready pid {os.getpid()}", flush=True)

    ds = SyntheticRegression(seed=rank)
    dl = DataLoader(ds, batch_size=64, shuffle=True, num_workers=2,
                    persistent_workers=True)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.MSELoss()

    # make sure every rank has built its data pipeline before training
    dist.barrier()

    state = MetricsState()
    stop_evt = threading.Event()
    metrics_thread = None

    global_step = 0
    for epoch in range(epochs):
        if epoch == 1 and metrics_thread is None:
            # start overlapping metric sync after warm-up epoch
            metrics_thread = threading.Thread(
                target=metrics_sync_loop, args=(rank, state, stop_evt, 0.5),
                name="metrics-sync", daemon=True)
            metrics_thread.start()
        t0 = time.time()
        for i, (x, y) in enumerate(dl):
            opt.zero_grad()
            out = model(x)
            loss = loss_fn(out, y)
            loss.backward()
            # each rank trains its own replica (ensemble members); only the
            # loss and the metrics are synchronised across ranks
            gn = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0))
            opt.step()
            # sync loss for logging
            lt = loss.detach().reshape(1).clone()
            dist.all_reduce(lt)
            lt /= world_size
            state.update(float(lt), gn, opt.param_groups[0]["lr"], x.shape[0])
            global_step += 1
            if rank == 0 and i % 10 == 0:
                print(f"epoch {epoch} step {i} loss {lt.item():.4f} grad_norm {gn:.3f}",
                      flush=True)
            time.sleep(0.03)  # simulate a heavier model
        if rank == 0:
            print(f"epoch {epoch} done in {time.time() - t0:.2f}s", flush=True)

    stop_evt.set()
    if metrics_thread is not None:
        metrics_thread.join()
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print("training finished", flush=True)


def main():
    import socket

    import torch.multiprocessing as mp
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    os.environ.update(RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    mp.spawn(worker, args=(2, 4), nprocs=2, join=True)


if __name__ == "__main__":
    main()
