"""torch.multiprocessing.spawn job (the launcher's environment holds RANK=0 etc., as a cluster
wrapper exports them); rank 0's in-house experiment tracker starts a non-daemon sender thread
that is never told to stop (its atexit flush would, but Python joins non-daemon threads
before it runs atexit handlers): training finishes, ranks 1-3 exit, rank 0 never does.

Written blind on 2026-12-04 by a helper that had read only the README (helper 56; three
files here made one: tracker, worker, launcher). Its verdict was "Unknown" (fixed: a
spawned child's main thread joins its threads in multiprocessing's BaseProcess._bootstrap).
"""
LAUNCH = "python"
NPROC = 4
EXPECT = {"kind": "stuck-outside-collective", "culprit_ranks": [0],
          "says": ["Stuck at exit", "'tracker-sender'", "tracker", "Ranks 1-3 exited cleanly"]}

import os
import torch.multiprocessing as mp
import atexit
import queue
import threading
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

from hangtrace import tracer



class Synth(Dataset):
    def __init__(self, n=256, d=16):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, d, generator=g)
        self.y = self.x.sum(1, keepdim=True) * 0.5

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def worker(local_idx, world_size, epochs):
    # cluster wrapper exported RANK=0 for the launcher; each spawned worker is its own rank
    os.environ["RANK"] = str(local_idx)
    rank = local_idx
    dist.init_process_group("gloo", rank=rank, world_size=world_size)

    tracker = TrackerClient("llm-pretrain", "run-42") if rank == 0 else None

    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ds = Synth()
    sampler = DistributedSampler(ds, num_replicas=world_size, rank=rank)
    loader = DataLoader(ds, batch_size=16, sampler=sampler, num_workers=2)

    step = 0
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            tracer.step(step)
            with tracer.phase("train"):
                loss = nn.functional.mse_loss(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
            with tracer.phase("metrics"):
                l = loss.detach().clone()
                dist.all_reduce(l)
                l /= world_size
                if tracker is not None:
                    tracker.log(step, loss=l.item(), epoch=epoch)
            step += 1
        if rank == 0:
            print(f"epoch {epoch} loss {l.item():.4f}", flush=True)

    with tracer.phase("teardown"):
        dist.barrier()
        dist.destroy_process_group()
    print(f"rank {rank} training done (pid {os.getpid()})", flush=True)


# --- the tracker (tracker.py in the helper's job) ---
class TrackerClient:
    def __init__(self, project, run_name, batch_size=32, send_latency_s=0.2):
        self.project = project
        self.run_name = run_name
        self.batch_size = batch_size
        self.send_latency_s = send_latency_s
        self._q = queue.Queue()
        self._stopping = False
        self._sent = 0
        # not a daemon: we don't want to lose metrics if the interpreter is tearing down
        self._sender = threading.Thread(target=self._sender_loop, name="tracker-sender")
        self._sender.start()
        # make sure everything gets out at the end of the run
        atexit.register(self._flush_at_exit)

    def log(self, step, **metrics):
        self._q.put({"step": step, **metrics})

    def _send(self, batch):
        # stand-in for the HTTP POST to the tracking server
        time.sleep(self.send_latency_s)
        self._sent += len(batch)

    def _sender_loop(self):
        while not self._stopping:
            item = self._q.get()          # wait for the next metric
            batch = [item]
            while len(batch) < self.batch_size:
                try:
                    batch.append(self._q.get_nowait())
                except queue.Empty:
                    break
            self._send(batch)
            for _ in batch:
                self._q.task_done()

    def _flush_at_exit(self):
        self._q.join()
        self._stopping = True
        print(f"[tracker] flushed {self._sent} metrics for {self.project}/{self.run_name}", flush=True)


def main():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    os.environ.update(RANK="0", WORLD_SIZE="4", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    mp.spawn(worker, args=(4, 2), nprocs=4, join=True)


if __name__ == "__main__":
    main()
