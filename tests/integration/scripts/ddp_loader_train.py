"""A plain DDP training job with DataLoader workers, run under torchrun (issue 38, item 1).

Every rank trains a small model wrapped in DistributedDataParallel on batches from a
DataLoader with two persistent workers; DDP's gradient all-reduce runs in C++ (the Python
wrappers never see it). Nothing else: no phases, no explicit collectives, no heartbeat.

Arguments: ``--out DIR`` (required): rank 0 writes ``DIR/step`` (the number of the last
finished step, rewritten each step) so a test can wait for training without reading
stdout; ``--steps N`` (default: train until killed); ``--hang-rank R --hang-step S``: at
step S rank R waits in ``multiprocessing.Queue.get()`` on a queue nobody fills (a
producer process that died, say) while the other ranks go on into backward and wait in
DDP's gradient all-reduce; rank R then writes ``DIR/hanging``. ``--metric-step S``: after step
S rank 0 alone all-reduces a metric (a logging branch under ``if rank == 0``) while the others
go on into the next step's backward and DDP's gradient all-reduce; rank 0 writes
``DIR/hanging`` first.
"""

import argparse
import datetime
import multiprocessing
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset


class Points(Dataset):
    def __init__(self, n: int = 4096, dim: int = 32) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, dim, generator=g)
        self.y = torch.randn(n, 1, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def _write(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--hang-rank", type=int, default=-1)
    ap.add_argument("--hang-step", type=int, default=20)
    ap.add_argument("--metric-step", type=int, default=-1)
    a = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Points(), batch_size=16, num_workers=2, persistent_workers=True, shuffle=True)
    inbox: "multiprocessing.Queue[int]" = multiprocessing.Queue()
    step = 0
    while a.steps <= 0 or step < a.steps:
        for x, y in loader:
            step += 1
            if rank == a.hang_rank and step == a.hang_step:
                _write(os.path.join(a.out, "hanging"), str(step))
                inbox.get()  # nobody ever puts: this rank hangs outside collectives
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if rank == 0:
                _write(os.path.join(a.out, "step"), str(step))
            if rank == 0 and step == a.metric_step:
                _write(os.path.join(a.out, "hanging"), str(step))
                dist.all_reduce(loss.detach().reshape(1))  # rank 0 only: the others never call it
            if a.steps > 0 and step >= a.steps:
                break
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
