"""The real traced job whose rings ``bench_scale.py`` clones: a small gloo job as real jobs are.

Each rank (``RANK``/``WORLD_SIZE``/``MASTER_*`` from the environment, traced by
``HANGTRACE=1``): a DDP model (its gradient all-reduces are C++-issued: only torch's Flight
Recorder sees them), a ``DataLoader`` with 2 persistent workers (helper processes with rings
of their own), ``--steps`` steps each in a ``tracer.phase('train', step)`` with a
Python-issued ``all_reduce`` of the loss and ``tracer.step``, an ``eval`` phase with a
barrier every 50 steps, and ``--step-sleep-s`` of compute per step so the 1 Hz memory
sampler records what a real run records. After the last step, the last rank (the culprit)
leaves the loop and sleeps in a phase of its own ('checkpoint') while the others block
in one more ``all_reduce``: each prints ``HANGING <rank>`` first.

    HANGTRACE=1 HANGTRACE_DIR=RUN RANK=.. WORLD_SIZE=4 MASTER_ADDR=.. MASTER_PORT=.. \\
        python benchmarks/scale_job.py [--steps 300] [--step-sleep-s 0.03]
"""

import argparse
import datetime
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from hangtrace import tracer


class Inputs(torch.utils.data.Dataset):
    """Random inputs, made in the DataLoader workers."""

    def __len__(self) -> int:
        return 1 << 20

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.randn(32, generator=torch.Generator().manual_seed(i))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--step-sleep-s", type=float, default=0.03)
    a = ap.parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = iter(
        torch.utils.data.DataLoader(Inputs(), batch_size=8, num_workers=2, persistent_workers=True)
    )
    for step in range(a.steps):
        with tracer.phase("train", step):
            opt.zero_grad()
            loss = model(next(batches)).sum()
            loss.backward()
            opt.step()
            dist.all_reduce(loss.detach())
            time.sleep(a.step_sleep_s)
        tracer.step(step + 1)
        if step % 50 == 49:
            with tracer.phase("eval", step):
                dist.barrier()
    print("HANGING %d" % rank, flush=True)
    if rank == world - 1:
        with tracer.phase("checkpoint", a.steps):
            time.sleep(3600)
    dist.all_reduce(torch.ones(1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
