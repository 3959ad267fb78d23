"""A DDP job for two simulated nodes (issue 39): each rank trains a small model wrapped in
DistributedDataParallel (gloo; the gradient all-reduce runs in C++). ``--out DIR``: rank 0
writes ``DIR/step`` after each step. ``--sleep-rank R --sleep-step S``: at step S rank R
writes ``DIR/sleeping-R`` and sleeps outside collectives while the others wait in DDP's all-reduce
(``--sleep-when FILE``: at the first step from S on at which FILE exists). ``--steps N``: stop after N."""

import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def _write(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def load_batch(rank, step, sleep_rank, sleep_step, out, when=None):
    if rank == sleep_rank and step >= sleep_step and (when is None or os.path.exists(when)):
        _write(os.path.join(out, "sleeping-%d" % rank), str(step))
        time.sleep(3600)  # stuck outside collectives
    return torch.randn(8, 16), torch.randn(8, 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--sleep-rank", type=int, default=-1)
    ap.add_argument("--sleep-step", type=int, default=20)
    ap.add_argument("--sleep-when", default=None)
    a = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    rank = dist.get_rank()
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step = 0
    while a.steps <= 0 or step < a.steps:
        step += 1
        x, y = load_batch(rank, step, a.sleep_rank, a.sleep_step, a.out, a.sleep_when)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0:
            _write(os.path.join(a.out, "step"), str(step))
        time.sleep(0.02)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
