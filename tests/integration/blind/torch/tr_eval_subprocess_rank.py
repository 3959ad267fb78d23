"""torchrun, 2 ranks, DDP with DataLoader workers; every 5 steps rank 0 saves a checkpoint and
runs the team's offline eval script with ``subprocess.run``. The script "supports distributed
eval": at import it calls ``init_process_group`` when WORLD_SIZE is set, and the child
inherited torchrun's RANK=0, WORLD_SIZE=2, MASTER_ADDR and MASTER_PORT: it joins the job's own
rendezvous as a second rank 0 and hangs; rank 0 waits in subprocess.run, rank 1 in DDP's
gradient all-reduce.

Written blind on 2026-12-04 by a helper that had read only the README (helper 66; its two
files made one here: ``--eval`` runs this file as the eval script). Its verdict was wrong:
the child was analysed as rank 0 ("collective mismatch … the sequence diverged"), after the
60 s start-up grace the child held open (fixed: a rank's descendant that joins as its rank
never stands for it, process_model.py; a second claimant of a working rank holds no start-up
grace, watch/headers.py; the child wait says it joined as the rank).
"""
LAUNCH = "torchrun"
NPROC = 2
EXPECT = {"kind": "stuck-outside-collective", "culprit_ranks": [0],
          "says": ["waits for its child process", "joined or asked to join the job's process group as rank 0 too",
                   "Next: start the child without the job's distributed variables"]}

import os, subprocess, sys, time
import torch
import torch.distributed as dist
import torch.nn as nn

if "--eval" in sys.argv and "WORLD_SIZE" in os.environ:  # (the eval script's import-time init)
    dist.init_process_group("gloo")

from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

HERE = os.path.dirname(os.path.abspath(__file__))
EVAL_EVERY = 5


class ToyData(Dataset):
    def __init__(self, n=4096):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 32, generator=g)
        w = torch.randn(32, 1, generator=g)
        self.y = (self.x @ w + 0.1 * torch.randn(n, 1, generator=g))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def make_model():
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))


def run_eval(ckpt_path):
    # offline eval script, shared with the eval team
    subprocess.run([sys.executable, os.path.abspath(__file__), "--eval", ckpt_path], check=True)


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1234)
    model = DDP(make_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ds = ToyData()
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True)
    loader = DataLoader(ds, batch_size=64, sampler=sampler, num_workers=2)
    import tempfile  # (the corpus: a folder per run, not the tree)
    ckpt_dir = os.path.join(tempfile.gettempdir(), "blind66-ckpt-%s" % os.environ.get("MASTER_PORT", "0"))
    os.makedirs(ckpt_dir, exist_ok=True)

    step = 0
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for x, y in loader:
            step += 1
            t0 = time.time()
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            avg = loss.detach().clone()
            dist.all_reduce(avg)
            avg /= world
            if rank == 0:
                print(f"epoch {epoch} step {step} loss {avg.item():.4f} ({time.time()-t0:.3f}s)", flush=True)
            if step % EVAL_EVERY == 0 and rank == 0:
                path = os.path.join(ckpt_dir, f"step{step}.pt")
                torch.save({"step": step, "model": model.module.state_dict()}, path)
                run_eval(path)
    dist.destroy_process_group()


def eval_main(path):
    """The offline eval script (eval_ckpt.py of the incident)."""
    is_dist = dist.is_available() and dist.is_initialized()
    ck = torch.load(path, map_location="cpu")
    model = make_model()
    model.load_state_dict(ck["model"])
    model.eval()
    g = torch.Generator().manual_seed(99)
    x = torch.randn(512, 32, generator=g)
    with torch.no_grad():
        score = model(x).abs().mean()
    if is_dist:
        dist.all_reduce(score)
        score /= dist.get_world_size()
    if not is_dist or dist.get_rank() == 0:
        print(f"[eval] step {ck['step']} mean|pred| {score.item():.4f}", flush=True)
    if is_dist:
        dist.destroy_process_group()


if __name__ == "__main__":
    if "--eval" in sys.argv:
        eval_main(sys.argv[sys.argv.index("--eval") + 1])
    else:
        main()
