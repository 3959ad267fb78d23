"""A gloo training loop where one rank becomes slow from a step on (issue 43).

Every rank, each step: ``tracer.step(i)``; phase 'data' (a little work); phase 'train'
(``--work`` units of CPU work: 1x1 matmuls of a 64x64 tensor, then a gradient all-reduce: a
Python-issued ``dist.all_reduce``, or with ``--ddp`` a DistributedDataParallel backward whose
all-reduce torch issues from C++). Rank ``--slow-rank`` from step ``--slow-from`` on:

* ``--mode compute``: does ``--factor`` times the work (its compute becomes that much slower);
* ``--mode contention``: pins itself to CPU 0 (``os.sched_setaffinity``) beside a CPU burner
  pinned to the same core (not a sleep: it gets about half the core); the burner is started
  at start-up and stopped (SIGSTOP) until then, so the contention begins at that step;
* ``--mode noise``: no slow rank; every rank sleeps a random 0..``--noise-ms`` each step.

Rank 0 writes ``--out DIR/step`` (the last finished step). The loop ends after ``--steps``
steps or when ``DIR/stop`` appears (checked by every rank each step, agreed by an all-reduce so
all stop at one step). Prints ``DONE <rank>`` at the end.
"""

import argparse
import datetime
import os
import random
import signal
import subprocess
import sys
import time

import torch
import torch.distributed as dist

from hangtrace import tracer


def work(units: int, x: torch.Tensor) -> torch.Tensor:
    for _ in range(units):
        x = torch.tanh(x @ x * 0.01)
    return x


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--slow-rank", type=int, default=2)
    ap.add_argument("--slow-from", type=int, default=20)
    ap.add_argument("--factor", type=float, default=4.0)
    ap.add_argument("--work", type=int, default=200)
    ap.add_argument("--mode", default="compute", choices=["compute", "contention", "noise"])
    ap.add_argument("--noise-ms", type=float, default=20.0)
    ap.add_argument("--ddp", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    rank = dist.get_rank()
    rng = random.Random(rank)
    x0 = torch.randn(64, 64, generator=torch.Generator().manual_seed(rank))
    model = opt = None
    if a.ddp:
        from torch.nn.parallel import DistributedDataParallel as DDP

        torch.manual_seed(0)
        model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1)))
        opt = torch.optim.SGD(model.parameters(), lr=0.001)
    burner = None
    if a.mode == "contention" and rank == a.slow_rank:
        # started now, stopped once it runs: at the slow step it burns at once (a Python start-up
        # on a loaded machine takes seconds, which would move the onset by several steps)
        burner = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import os; os.sched_setaffinity(0, {0}); print('ready', flush=True)\nwhile True: pass",
            ],
            stdout=subprocess.PIPE,
        )
        burner.stdout.readline()
        os.kill(burner.pid, signal.SIGSTOP)
    slow = False
    step = 0
    try:
        for step in range(a.steps):
            slow = a.mode != "noise" and rank == a.slow_rank and step >= a.slow_from
            if slow and burner is not None and step == a.slow_from:
                os.sched_setaffinity(0, {0})
                os.kill(burner.pid, signal.SIGCONT)
            tracer.step(step)
            with tracer.phase("data"):
                x = work(2, x0)
                if a.mode == "noise":
                    time.sleep(rng.uniform(0, a.noise_ms) / 1000.0)
            with tracer.phase("train"):
                units = int(a.work * a.factor) if slow and a.mode == "compute" else a.work
                x = work(units, x)
                if a.ddp:
                    assert model is not None and opt is not None
                    opt.zero_grad()
                    model(x).sum().backward()  # DDP's C++ all-reduce of the gradients
                    opt.step()
                else:
                    dist.all_reduce(x[:1].contiguous())
            stop = torch.tensor([1.0 if os.path.exists(os.path.join(a.out, "stop")) else 0.0])
            dist.all_reduce(stop)  # all ranks stop at one step
            if rank == 0:
                tmp = os.path.join(a.out, "step.tmp")
                with open(tmp, "w") as f:
                    f.write(str(step))
                os.replace(tmp, os.path.join(a.out, "step"))
            if stop.item() > 0:
                break
    finally:
        if burner is not None:
            burner.kill()
            burner.wait()
    print("DONE %d %d" % (rank, step), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
