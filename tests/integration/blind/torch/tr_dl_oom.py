"""2-rank gloo DDP job under torchrun; rank 1's DataLoader worker hits a
pathological sample whose decoding balloons memory until the kernel OOM killer
(container memory limit, reproduced with a child memory cgroup) kills it."""
LAUNCH = "torchrun"
NPROC = 2
EXPECT = {"kind": "dead-rank", "culprit_ranks": [1], "cause": "exception",
          "says": ["killed by the kernel's OOM killer"]}
REQUIRES = "memory-cgroup"  # (root and a writable memory cgroup: the kernel's own OOM kill)

import os
import subprocess
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

try:
    from hangtrace import tracer
except Exception:  # runs without hangtrace too
    import contextlib

    class _NoTracer:
        def step(self, n):
            pass

        def phase(self, name):
            return contextlib.nullcontext()

    tracer = _NoTracer()

CG_ROOT = "/sys/fs/cgroup/memory"
LIMIT = 400 * 1024 * 1024
CHUNK = 20 * 1024 * 1024
BATCH = 8
STEPS = 40
BAD_FROM_STEP = 12        # rank 1's batches from this one on contain pathological samples

_decoded = []             # the "decoder cache" that balloons


def cgroup_dir(rank1_pid):
    return f"{CG_ROOT}/hangtrace-test-blindoom-{rank1_pid}"


class SyntheticDataset(Dataset):
    def __init__(self, rank, world, n):
        self.rank, self.world, self.n = rank, world, n

    def __len__(self):
        return self.n

    def __getitem__(self, idx):
        g = torch.Generator().manual_seed(idx)
        x = torch.randn(32, generator=g)
        y = x.sum(dim=0, keepdim=True) * 0.1
        local_pos = idx // self.world           # DistributedSampler(shuffle=False)
        if self.rank == 1 and local_pos >= BAD_FROM_STEP * BATCH:
            # pathological sample: decoding balloons memory
            for _ in range(3):
                _decoded.append(bytearray(b"\xa5") * CHUNK)
                time.sleep(float(os.environ.get("DECODE_SLEEP_S", "0.2")))
        return x, y


def worker_init_fn(worker_id):
    info = torch.utils.data.get_worker_info()
    if info.dataset.rank != 1:
        return
    d = cgroup_dir(os.getppid())
    try:
        os.makedirs(d, exist_ok=True)
        with open(f"{d}/memory.limit_in_bytes", "w") as f:
            f.write(str(LIMIT))
        if os.path.exists(f"{d}/memory.memsw.limit_in_bytes"):
            try:
                with open(f"{d}/memory.memsw.limit_in_bytes", "w") as f:
                    f.write(str(LIMIT))
            except OSError:
                pass
        with open(f"{d}/cgroup.procs", "w") as f:
            f.write(str(os.getpid()))
        print(f"[rank 1 worker {worker_id} pid {os.getpid()}] in memory cgroup {d} "
              f"(limit {LIMIT >> 20} MiB)", flush=True)
    except OSError as e:
        print(f"[rank 1 worker {worker_id}] cannot set up cgroup: {e}", flush=True)


def start_cgroup_reaper(rank1_pid):
    """rmdir the cgroup once rank 1 and every process in the cgroup are gone."""
    d = cgroup_dir(rank1_pid)
    script = (
        f'end=$(($(date +%s)+600)); '
        f'while [ $(date +%s) -lt $end ]; do '
        f'  if ! kill -0 {rank1_pid} 2>/dev/null; then '
        f'    if [ ! -d {d} ]; then exit 0; fi; '
        f'    if [ ! -s {d}/cgroup.procs ]; then rmdir {d} && exit 0; fi; '
        f'  fi; sleep 1; done'
    )
    subprocess.Popen(["sh", "-c", script], start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)


def train(rank, world):
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ds = SyntheticDataset(rank, world, STEPS * BATCH * world)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=False)
    loader = DataLoader(ds, batch_size=BATCH, sampler=sampler, num_workers=2,
                        worker_init_fn=worker_init_fn)
    if rank == 1:
        start_cgroup_reaper(os.getpid())
    for step, (x, y) in enumerate(loader):
        tracer.step(step)
        with tracer.phase("train"):
            t0 = time.time()
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            time.sleep(0.15)     # the rest of a real step
            l = loss.detach().clone()
            dist.all_reduce(l)
            l /= world
        print(f"[rank {rank}] step {step} loss {l.item():.4f} ({time.time() - t0:.2f}s)",
              flush=True)
    print(f"[rank {rank}] done", flush=True)


def main():
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    try:
        train(rank, world)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
