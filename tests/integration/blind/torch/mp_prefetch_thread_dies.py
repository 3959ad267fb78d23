"""Incident: 3 ranks started with plain multiprocessing (spawn; the parent sets RANK,
WORLD_SIZE, MASTER_ADDR/PORT in each child's environment); each rank's daemon 'prefetch'
thread loads shard files into a ``queue.Queue(maxsize=2)`` and the main loop does ``q.get()``
without a timeout and all-reduces the gradients. Rank 0's shard 8 is missing: its prefetch
thread dies of FileNotFoundError (printed by Python's excepthook among 50 log lines a step),
rank 0 blocks in ``q.get()``, ranks 1-2 wait in all_reduce.

Written blind on 2026-12-04 by a helper that had read only the README (helper 81): right on
the first run, naming the thread's exception ("It stopped after an exception: rank 0's thread
'prefetch' died of FileNotFoundError ... at prefetch (job.py:20) ..."). For the corpus: the
shards in a temporary folder instead of next to the file.
"""
LAUNCH = "mp"
EXPECT = {"kind": "stuck-outside-collective", "culprit_ranks": [0], "cause": None,
          "says": ("thread 'prefetch' died of FileNotFoundError",)}

import os, sys, time, queue, threading, socket, tempfile, shutil
import multiprocessing as mp
import torch, torch.nn as nn, torch.distributed as dist

# (corpus: the shards in a temporary folder the parent makes and names in the environment)
SHARD_DIR = os.environ.get("BLIND81_SHARDS", "")
N_SHARDS = 30

def make_shards():
    os.makedirs(SHARD_DIR, exist_ok=True)
    for r in range(3):
        for i in range(N_SHARDS):
            p = os.path.join(SHARD_DIR, f"rank{r}_shard{i:04d}.pt")
            torch.save({"x": torch.randn(16, 32), "y": torch.randn(16, 1)}, p)
    # the missing shard: rank 0, shard 8 (prefetch runs 2 ahead of step ~6)
    os.remove(os.path.join(SHARD_DIR, "rank0_shard0008.pt"))

def prefetch(rank, q):
    for i in range(N_SHARDS):
        path = os.path.join(SHARD_DIR, f"rank{rank}_shard{i:04d}.pt")
        with open(path, "rb") as f:           # FileNotFoundError on rank 0
            batch = torch.load(f)
        q.put(batch)

def worker():
    rank = int(os.environ["RANK"]); ws = int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    q = queue.Queue(maxsize=2)
    t = threading.Thread(target=prefetch, args=(rank, q), daemon=True, name="prefetch")
    t.start()
    for step in range(N_SHARDS):
        batch = q.get()
        loss = nn.functional.mse_loss(model(batch["x"]), batch["y"])
        opt.zero_grad(); loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad); p.grad /= ws
        opt.step()
        for k in range(50):
            print(f"[rank {rank}] step {step} log line {k} loss {loss.item():.4f}", flush=True)
        time.sleep(0.3)
    dist.destroy_process_group()

def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

if __name__ == "__main__":
    SHARD_DIR = os.environ["BLIND81_SHARDS"] = tempfile.mkdtemp(prefix="blind81-shards-")
    import signal
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # (corpus: the shards removed when stopped)
    make_shards()
    ctx = mp.get_context("spawn")
    port = str(free_port())
    procs = []
    for r in range(3):
        os.environ.update(RANK=str(r), WORLD_SIZE="3", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        p = ctx.Process(target=worker, name=f"rank{r}")
        p.start(); procs.append(p)
    try:
        for p in procs: p.join()
    finally:
        shutil.rmtree(SHARD_DIR, ignore_errors=True)
    print("exit codes", [p.exitcode for p in procs])
