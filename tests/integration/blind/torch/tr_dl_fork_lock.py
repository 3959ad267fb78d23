"""Incident: a lock held at fork time, inherited by a DataLoader worker.

torchrun job, 2 ranks, gloo, DDP on a small model, `DataLoader(num_workers=2)` with the
default fork start method and workers re-created each epoch (no persistent_workers).
The dataset's `__getitem__` logs through a module-level `threading.Lock` (`_LOG_LOCK`)
that a background thread of the main process also takes: a metrics reporter (it runs on
the last rank, which owns the metrics push) that wakes often and holds the lock while it
formats and writes a line to a slow sink.  At some epoch start rank 1 forks its workers
while the reporter thread holds the lock: the forked worker inherits the lock in the held
state (the thread that would release it does not exist in the child), and its first
`__getitem__` blocks for ever in `_LOG_LOCK.acquire()`.  Rank 1's main process waits for
the first batch of the epoch (DataLoader timeout=0: none; the workers are alive, so torch
never raises), so it never reaches the next DDP gradient all-reduce; rank 0 waits in that
all-reduce (C++-issued by DDP inside loss.backward()) for ever.

The race is made likely, not planted: the reporter holds the lock ~95 % of the time
(20 ms held, 1 ms released, in a loop), starting after epoch 0, so the fork at the start
of epoch 1 (else 2, 3 ...) almost surely happens while it is held.  Rank 0 runs no
reporter, so its workers fork with the lock free.  No sleep or wait is planted in the
worker: the hang is only the inherited held lock.

Expected verdict (decided from the incident alone):
  rank 1 is the culprit. It is alive and in no collective: its main thread is blocked
  outside collectives in the DataLoader's `__next__` (`_next_data` -> `_get_data` ->
  `_try_get_data` -> multiprocessing queue get/poll) waiting for the first batch of the
  new epoch; the real stuck point is its DataLoader worker(s), blocked in
  `log_line` (`with _LOG_LOCK`, lock acquire) <- `ForkLockDataset.__getitem__` <- torch's
  worker fetch loop.  Rank 0 is a waiter (cascade), blocked in DDP's gradient all_reduce
  on the default group (seen via torch's Flight Recorder; Python frame: loss.backward()).
  Tool vocabulary: kind `stuck-outside-collective`, culprit_ranks [1], cause `blocked`,
  waiting_ranks [0]. A good verdict also names the DataLoader worker and the lock
  acquire in `__getitem__` (not just "queue.get").

LAUNCH: torchrun --nproc-per-node 2 tr_dl_fork_lock.py   (traced: hangtrace run --stall-s 10
        --stop-on-stall -- torchrun --nproc-per-node 2 tr_dl_fork_lock.py)
NPROC: 2
EXPECT: stuck-outside-collective, culprit rank 1, cause blocked (see above).
"""
LAUNCH = "torchrun"   # exact command: cd /tmp/blind_forklock && torchrun --nproc-per-node 2 tr_dl_fork_lock.py
LAUNCH_CMD = "torchrun --nproc-per-node 2 tr_dl_fork_lock.py"
NPROC = 2
EXPECT = {"kind": "stuck-outside-collective", "culprit_ranks": [1], "cause": "blocked",
          # "a good verdict also names the DataLoader worker and the lock acquire in __getitem__"
          # (the author's words above, made checkable when the job joined the corpus)
          "says": ["inside the dataset: log_line (tr_dl_fork_lock.py:", "ForkLockDataset.__getitem__"]}

import datetime
import multiprocessing
import os
import sys
import threading
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

# ---- logging shared by the dataset (in workers) and the reporter (in the main process) ----
_LOG_LOCK = threading.Lock()          # module-level, plain Lock: NOT re-initialised at fork
_LOG_PATH = None
_LOG_FILE = None


def _open_log(rank):
    global _LOG_PATH, _LOG_FILE
    _LOG_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"job-rank{rank}.log")
    _LOG_FILE = open(_LOG_PATH, "a", buffering=1)


def log_line(msg):
    with _LOG_LOCK:
        _LOG_FILE.write(f"{time.time():.3f} pid={os.getpid()} {msg}\n")


class ForkLockDataset(Dataset):
    def __init__(self, n=64, dim=16):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, dim, generator=g)
        self.y = torch.randn(n, 1, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        log_line(f"getitem {i}")        # blocks for ever in a worker forked while the lock was held
        return self.x[i], self.y[i]


# ---- metrics reporter: wakes often, holds the lock while it formats and writes ----
def reporter(rank, metrics, stop):
    n = 0
    while not stop.is_set():
        with _LOG_LOCK:
            n += 1
            line = " ".join(f"{k}={v:.5f}" if isinstance(v, float) else f"{k}={v}"
                            for k, v in sorted(metrics.items()))
            time.sleep(0.020)            # slow sink (metrics push / network write) under the lock
            _LOG_FILE.write(f"{time.time():.3f} [metrics #{n}] rank {rank} {line}\n")
        time.sleep(0.001)                # short release


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    _open_log(rank)
    print(f"rank {rank} pid {os.getpid()} up, start method {multiprocessing.get_start_method()}",
          flush=True)

    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ds = ForkLockDataset()
    # default start method (fork on Linux/py3.11), workers re-created every epoch, no timeout
    loader = DataLoader(ds, batch_size=8, num_workers=2, shuffle=False)

    metrics = {"epoch": 0, "step": 0, "loss": 0.0}
    stop = threading.Event()
    rep = None

    step = 0
    for epoch in range(20):
        metrics["epoch"] = epoch
        epoch_loss = torch.zeros(1)
        print(f"rank {rank} epoch {epoch} start (forking workers)", flush=True)
        for x, y in loader:              # iter() forks 2 fresh workers here
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()              # DDP gradient all_reduce (C++)
            opt.step()
            step += 1
            epoch_loss += loss.detach()
            metrics["step"] = step
            metrics["loss"] = float(loss.item())
        dist.all_reduce(epoch_loss)      # epoch metric, Python-issued
        print(f"rank {rank} epoch {epoch} done, mean loss {epoch_loss.item() / world:.4f}", flush=True)
        if rep is None and rank == world - 1:
            # the last rank owns the metrics push; reporter starts once there are metrics
            rep = threading.Thread(target=reporter, args=(rank, metrics, stop), daemon=True,
                                   name="metrics-reporter")
            rep.start()
    stop.set()
    print(f"rank {rank} finished all epochs: the race was not hit", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
