# Incident: node watchdog SIGKILLs one DataLoader worker of rank 1 (not memory related).
LAUNCH = "mp"
NPROC = 2
EXPECT = {"kind": "dead-rank", "culprit_ranks": [1], "cause": "exception",
          "says": ["killed by SIGKILL, not by the kernel's OOM killer"]}
import os, sys, time, signal, threading
os.environ.setdefault("OMP_NUM_THREADS", "1")
import multiprocessing as mp
import torch, torch.nn as nn, torch.distributed as dist
from torch.utils.data import Dataset, DataLoader
from torch.utils.data.distributed import DistributedSampler
from torch.nn.parallel import DistributedDataParallel as DDP
try:
    from hangtrace import tracer
except ImportError:
    tracer = None
import contextlib

WORLD = 2
PORT = 29000 + os.getpid() % 1000
STEPS = 40
KILL_AT = 8
CUR_STEP = [0]

class Synthetic(Dataset):
    def __len__(self): return 4096
    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(32, generator=g)
        time.sleep(0.02)
        return x, x.sum().unsqueeze(0)

def children_of(pid):
    kids = []
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/children") as f:
                kids += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return kids

def watchdog(rank_pid):
    # the "node watchdog": thinks a worker is stuck and SIGKILLs it
    while CUR_STEP[0] < KILL_AT:
        time.sleep(0.05)
    kids = children_of(rank_pid)
    workers = []
    for k in kids:
        try:
            with open(f"/proc/{k}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue
        if "pt_data_worker" in comm or comm.startswith("python"):
            workers.append((k, comm))
    if not workers:
        print(f"[watchdog] no worker child found among {kids}", flush=True)
        return
    pid, comm = workers[0]
    print(f"[watchdog] SIGKILL worker pid {pid} ({comm}) of rank 1 at step {CUR_STEP[0]}", flush=True)
    os.kill(pid, signal.SIGKILL)

def phase(name):
    return tracer.phase(name) if tracer else contextlib.nullcontext()

def run(rank):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(PORT), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ds = Synthetic()
    dl = DataLoader(ds, batch_size=8, sampler=DistributedSampler(ds, WORLD, rank),
                    num_workers=2, persistent_workers=True)
    if rank == 1:
        threading.Thread(target=watchdog, args=(os.getpid(),), daemon=True).start()
    it = iter(dl)
    for step in range(STEPS):
        CUR_STEP[0] = step
        if tracer: tracer.step(step)
        with phase("train"):
            x, y = next(it)
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad(); loss.backward(); opt.step()
            l = loss.detach().clone()
            dist.all_reduce(l)
        if rank == 0:
            print(f"step {step} loss {l.item() / WORLD:.4f}", flush=True)
        time.sleep(0.1)
    dist.destroy_process_group()

if __name__ == "__main__":
    procs = [mp.Process(target=run, args=(r,)) for r in range(WORLD)]
    for p in procs: p.start()
    for p in procs: p.join()
    codes = [p.exitcode for p in procs]
    print("exit codes", codes, flush=True)
    sys.exit(0 if all(c == 0 for c in codes) else 1)
