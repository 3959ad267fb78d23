# Incident: rank 0's dataset cache leaks 4 MiB per sample; the container limit OOM-kills a worker.
LAUNCH = "torchrun"
NPROC = 2
EXPECT = {"kind": "dead-rank", "culprit_ranks": [0], "cause": "exception",
          "says": ["killed by the kernel's OOM killer"]}
REQUIRES = "memory-cgroup"  # (root and a writable memory cgroup: the kernel's own OOM kill)
import os, sys, time, subprocess, contextlib
os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch, torch.nn as nn, torch.distributed as dist
from torch.utils.data import Dataset, DataLoader, get_worker_info
from torch.utils.data.distributed import DistributedSampler
from torch.nn.parallel import DistributedDataParallel as DDP
try:
    from hangtrace import tracer
except ImportError:
    tracer = None

CG_ROOT = "/sys/fs/cgroup/memory"
LIMIT = 350 * 1024 * 1024
SAMPLE_FLOATS = 1024 * 1024          # 4 MiB of float32
SAFE_CAP = 16                        # cache cap when no cgroup can be made

def cg_dir(rank0_pid):
    return f"{CG_ROOT}/hangtrace-test-blindleak-{rank0_pid}"

class DecodedCache(Dataset):
    def __init__(self):
        self.cache = {}
        self.capped = False
    def __len__(self): return 100000
    def __getitem__(self, i):
        time.sleep(0.3)              # "decode"
        if i not in self.cache:
            if self.capped and len(self.cache) >= SAFE_CAP:
                self.cache.pop(next(iter(self.cache)))
            self.cache[i] = torch.full((SAMPLE_FLOATS,), float(i % 7))   # kept forever (the leak)
        s = self.cache[i]
        x = s[:32].clone() + torch.randn(32)
        return x, x.sum().unsqueeze(0)

def worker_init(worker_id):
    info = get_worker_info()
    if os.environ.get("RANK") != "0":
        return
    d = cg_dir(os.getppid())
    try:
        os.makedirs(d, exist_ok=True)
        with open(f"{d}/memory.limit_in_bytes", "w") as f:
            f.write(str(LIMIT))
        try:
            with open(f"{d}/memory.memsw.limit_in_bytes", "w") as f:
                f.write(str(LIMIT))
        except OSError:
            pass
        with open(f"{d}/cgroup.procs", "w") as f:
            f.write(str(os.getpid()))
        print(f"[rank0 worker {worker_id}] pid {os.getpid()} in {d} (limit 350 MiB)", flush=True)
    except OSError as e:
        print(f"[rank0 worker {worker_id}] no cgroup ({e}); capping cache", flush=True)
        info.dataset.capped = True

def start_cleanup(rank0_pid):
    d = cg_dir(rank0_pid)
    script = (f'while kill -0 {rank0_pid} 2>/dev/null; do sleep 1; done; '
              f'i=0; while [ $i -lt 120 ]; do '
              f'if [ ! -d {d} ]; then exit 0; fi; '
              f'if [ -z "$(cat {d}/cgroup.procs 2>/dev/null)" ]; then rmdir {d} 2>/dev/null && exit 0; fi; '
              f'sleep 1; i=$((i+1)); done')
    subprocess.Popen(["sh", "-c", script], start_new_session=True,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

def phase(name):
    return tracer.phase(name) if tracer else contextlib.nullcontext()

def main():
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        start_cleanup(os.getpid())
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ds = DecodedCache()
    dl = DataLoader(ds, batch_size=2, sampler=DistributedSampler(ds, world, rank),
                    num_workers=2, persistent_workers=True, worker_init_fn=worker_init)
    it = iter(dl)
    for step in range(150):
        if tracer: tracer.step(step)
        with phase("train"):
            x, y = next(it)
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad(); loss.backward(); opt.step()
            l = loss.detach().clone()
            dist.all_reduce(l)
        if rank == 0:
            print(f"step {step} loss {l.item() / world:.4f}", flush=True)
    dist.destroy_process_group()

if __name__ == "__main__":
    main()
