"""The queue hang of the console goldens (recorded once, see README.md here): 2 gloo ranks
started by ``torch.multiprocessing.spawn``; each rank reads its batches from a
``multiprocessing.Queue`` filled by a feeder process of its own. Rank 1's feeder dies at
its third batch (a KeyError building it), so rank 1 blocks for ever in ``Queue.get``
while rank 0 goes on to the next step and waits in the loss all_reduce."""

import multiprocessing as mp
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as tmp
from hangtrace import tracer


def feeder(q: "mp.Queue", rank: int) -> None:
    for i in range(100):
        batch = {"x": [float(i)] * 4}
        if rank == 1 and i == 2:
            batch = {}  # this rank's reader lost its schema
        q.put(batch["x"])


class Trainer:
    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world
        self.batches: "mp.Queue" = mp.get_context("spawn").Queue()
        self.feed = mp.get_context("spawn").Process(target=feeder, args=(self.batches, rank), daemon=True)
        self.feed.start()

    def next_batch(self) -> torch.Tensor:
        return torch.tensor(self.batches.get())

    def train(self, steps: int) -> None:
        for step in range(steps):
            tracer.step(step)
            with tracer.phase("train"):
                x = self.next_batch()
                loss = x.sum()
                dist.all_reduce(loss)
            print("rank %d step %d loss %.1f" % (self.rank, step, float(loss)), flush=True)


def worker(rank: int, world: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    Trainer(rank, world).train(10)
    dist.destroy_process_group()


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 29561
    tmp.spawn(worker, args=(2, port), nprocs=2)
