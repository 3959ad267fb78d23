"""Incident (rank 0's logging thread steals its GIL, written blind 2026-12-07): a 3-rank DDP
job logs to an experiment tracker from rank 0 only, through a client that runs its own
asyncio event loop in a background thread ("tracker"). When warm-up ends at step 25 the
config turns on weight-histogram logging: every step rank 0 hands a copy of its first layer's weights
to the tracker, whose asyncio task bins them in pure Python before "sending" them. That
task holds the GIL for most of each step, so rank 0's training loop (many small torch
calls, each needing the GIL) slows down; and the client's queue is bounded (2 records), so
once the sender lags, rank 0's log call waits for it. Ranks 1-2 wait for rank 0 in DDP's
all-reduce. Every rank also has a small heartbeat thread that prints throughput each
second. Nothing fails or hangs.

torchrun, 3 ranks, gloo, DDP, DataLoader(num_workers=2, persistent_workers=True), a
thread with an asyncio loop on rank 0, a plain thread on every rank; steps and phases
marked with the hangtrace phase API ("data", "train", "log").

Expected: progressing, rank 0 named as the straggler since about step 25 (23-30).
"""
LAUNCH = "torchrun"
NPROC = 3
STEPS = 80
DUMP_AT_STEP = 45
EXPECT = {"straggler": 0, "since_step": (23, 30), "min_added_pct": 30}

import asyncio
import datetime
import statistics
import threading
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from hangtrace import tracer


def say(msg, **_):
    sys.stdout.write(msg + "\n")  # one write: ranks share the console
    sys.stdout.flush()


BATCH = 64
DIM = 320
HISTOGRAMS_FROM = 25


class TrackerClient:
    """An experiment-tracker client: its own event loop in a thread, a queue of records."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.sent = 0
        self.thread = threading.Thread(target=self._run, name="tracker", daemon=True)
        self.thread.start()

    def _run(self):
        asyncio.set_event_loop(self.loop)
        self.queue = asyncio.Queue(maxsize=2)  # bounded: log() blocks when the sender lags
        self.loop.create_task(self._sender())
        self.loop.run_forever()

    async def _sender(self):
        while True:
            step, name, values = await self.queue.get()
            if values is not None:
                lo, hi = min(values), max(values)
                width = (hi - lo) / 64 or 1.0
                bins = [0] * 65
                for v in values:  # pure-Python histogram: holds the GIL
                    bins[int((v - lo) / width)] += 1
            await asyncio.sleep(0.001)  # the HTTP post
            self.sent += 1

    def log(self, step, name, values=None):
        asyncio.run_coroutine_threadsafe(self.queue.put((step, name, values)), self.loop).result()


def heartbeat(rank, state, stop):
    last = 0
    while not stop.wait(1.0):
        print(f"[rank {rank}] {state['step'] - last} steps/s", flush=True)
        last = state["step"]


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(*[nn.Sequential(nn.Linear(DIM, DIM), nn.ReLU()) for _ in range(6)],
                              nn.Linear(DIM, 10)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(11)
    x = torch.randn(STEPS * BATCH * world, DIM, generator=g)
    ds = TensorDataset(x, torch.randint(0, 10, (len(x),), generator=g))
    loader = DataLoader(ds, batch_size=BATCH, sampler=DistributedSampler(ds, seed=2),
                        num_workers=2, persistent_workers=True, drop_last=True)
    tracker = TrackerClient() if rank == 0 else None
    state, stop = {"step": 0}, threading.Event()
    threading.Thread(target=heartbeat, args=(rank, state, stop), name="heartbeat", daemon=True).start()

    it = iter(loader)
    rows = []  # (step, fwd_ms, bwd_sync_ms, step_ms, log_ms)
    for step in range(STEPS):
        tracer.step(step)
        state["step"] = step
        t0 = time.perf_counter()
        with tracer.phase("data"):
            xb, yb = next(it)
        with tracer.phase("train"):
            t1 = time.perf_counter()
            loss = nn.functional.cross_entropy(model(xb), yb)
            t2 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        t3 = time.perf_counter()
        with tracer.phase("log"):
            if tracker is not None:
                tracker.log(step, "loss")
                if step >= HISTOGRAMS_FROM:
                    for i in (0,):
                        w = model.module[i][0].weight.detach().flatten()
                        tracker.log(step, f"hist/layer{i}", w.tolist())
        t4 = time.perf_counter()
        rows.append((step, (t2 - t1) * 1e3, (t3 - t2) * 1e3, (t4 - t0) * 1e3, (t4 - t3) * 1e3))
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f} ({(t4 - t0) * 1e3:.0f} ms)", flush=True)

    stop.set()
    for name, sel in (("before", [r for r in rows if 3 <= r[0] < HISTOGRAMS_FROM]),
                      ("after", [r for r in rows if r[0] >= HISTOGRAMS_FROM + 2])):
        med = lambda i: statistics.median(r[i] for r in sel)
        say(f"TIMING rank {rank} steps {name} step {HISTOGRAMS_FROM}: median step {med(3):.1f} ms, "
              f"forward {med(1):.1f} ms, bwd+DDP sync {med(2):.1f} ms, log {med(4):.1f} ms "
              f"(n={len(sel)})", flush=True)
    if tracker is not None:
        print(f"tracker sent {tracker.sent} records", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
