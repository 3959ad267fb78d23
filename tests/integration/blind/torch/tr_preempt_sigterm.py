"""Graceful-preemption handler on one rank only: rank 2 leaves, the others wait.

Incident: a 4-rank torchrun job on CPU (gloo). A small MLP is trained with DDP,
fed by DataLoader(num_workers=2, persistent_workers=True); every step the loss is
all_reduced for logging; about 40 steps. Like torchtitan / Lightning jobs, every
rank installs a "graceful preemption" handler: signal.signal(SIGTERM, handler)
that only sets a flag. At the top of each step the loop checks the flag and, if
set, saves a small checkpoint (torch.save to /tmp/blind92), prints "preempted,
exiting cleanly", breaks out of the loop and returns normally (exit code 0)
WITHOUT telling the other ranks. A cluster "node agent" preempts only rank 2:
simulated by a separate process started on rank 2,
  bash -c "sleep 6; kill -TERM <rank 2 pid>"
so the signal comes from another process, as from a real agent. Ranks 0, 1, 3
keep training and block in their next collective (DDP's gradient all-reduce in
backward, or the logging all_reduce) waiting for rank 2.

Launcher:
  hangtrace run --stall-s 10 --stop-on-stall -- \
      torchrun --nproc_per_node=4 tr_preempt_sigterm.py

EXPECT: culprit rank 2 -- rank 2 left the training loop and exited cleanly
(exit code 0) after it received SIGTERM from another process (the bash
"node agent", pid of `bash -c sleep 6; kill -TERM ...`), while ranks 0, 1, 3 wait
for it in the next collective (DDP all-reduce / logging all_reduce). In the
README's vocabulary: kind `dead-rank` (rank 2, cause: clean exit after SIGTERM
sent by another process) or `skipped-collective` with rank 2 as culprit ("rank 2
never issues the collective: it exited cleanly after SIGTERM"). NOT a crash, not
a straggler, not ranks 0/1/3. Fix: make the preemption decision collective
(all_reduce the flag so all ranks stop at the same step) or signal every rank.

Written blind by helper 92 (2026-12-04). gloo does not hang here: the peers' collectives
fail with "Connection closed by peer" 0.7 s after rank 2 returns. The first verdicts named
rank 0 ("alone entered all_reduce seq 42": its Flight Recorder count against its peers'
count of Python calls), then rank 1 ("Transport error ... no rank is dead ... check the
network"). Now: "Skipped collective: rank 2 left: its program returned (exit code 0) ...;
0.8 s later ranks 0-1,3 failed (...): their connections to rank 2 closing, not the
network. It had received SIGTERM from pid N (bash (exited)) at ..., in main (...), and
returned 0.2 s later: a SIGTERM handler ended its loop on this rank alone" with the advice
to make the stop collective.
Checkpoints go to the temp directory.
"""
LAUNCH = "torchrun"
NPROC = 4
EXPECT = {"kind": "skipped-collective", "culprit_ranks": [2], "cause": "skipped",
          "says": ("left: its program returned (exit code 0)", "received SIGTERM from pid", "bash")}

import os
import signal
import subprocess
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

PREEMPTED = False


def _on_sigterm(signum, frame):
    global PREEMPTED
    PREEMPTED = True


class Synthetic(Dataset):
    def __init__(self, n=4096, d=32):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, d, generator=g)
        self.y = (self.x.sum(dim=1, keepdim=True) > 0).float()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    signal.signal(signal.SIGTERM, _on_sigterm)

    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = nn.BCEWithLogitsLoss()
    ds = Synthetic()
    loader = DataLoader(ds, batch_size=16, sampler=DistributedSampler(ds),
                        num_workers=2, persistent_workers=True)

    if rank == 2:
        # the cluster's node agent: preempts this node (only rank 2 lives here)
        subprocess.Popen(["bash", "-c", f"sleep 6; kill -TERM {os.getpid()}"])

    step = 0
    it = iter(loader)
    while step < 40:
        if PREEMPTED:
            path = os.path.join(tempfile.gettempdir(), f"blind92_ckpt_rank{rank}_step{step}.pt")
            torch.save({"step": step, "model": model.module.state_dict()}, path)
            print(f"[rank {rank}] preempted, exiting cleanly (step {step}, saved {path})",
                  flush=True)
            break
        try:
            x, y = next(it)
        except StopIteration:
            it = iter(loader)
            x, y = next(it)
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()              # DDP gradient all-reduce (C++)
        opt.step()
        logged = loss.detach().clone()
        dist.all_reduce(logged)      # loss for logging
        if rank == 0:
            print(f"step {step} loss {logged.item() / world:.4f}", flush=True)
        time.sleep(0.3)              # the rest of a realistic step
        step += 1
    return 0


if __name__ == "__main__":
    main()
