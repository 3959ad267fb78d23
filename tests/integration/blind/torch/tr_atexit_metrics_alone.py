"""DDP training on a tiny MLP, 3 ranks, gloo, with a team metrics logger that
aggregates final counters in an atexit handler.

Incident: flush_metrics() (atexit) only all_reduces when its local buffer is
non-empty; only rank 1 has buffered metrics at the end. Ranks 0 and 2 destroy
their process group and exit; rank 1's all_reduce runs alone, fails (or waits),
the exception is caught, "metrics flush failed" is logged, exit code 0, and the
final metrics file is missing.

Written blind on 2026-12-04 by a helper that had read only the README (helper 87). First
verdicts: nothing during the run (a clean exit); ``hangtrace analyze`` afterwards **partly
right**: "Skipped collective: rank 1 alone entered all_reduce seq 1 ...; it failed there
(RuntimeError: Connection closed by peer ...) and exited cleanly (code 0): the program caught
the error", without saying it ran in an exit handler, and advice about rank-0-only code. Now
``hangtrace run`` reports it at the clean exit: "... it entered it after its program had
returned, in an exit handler (atexit, or a thread ending at shutdown); it failed there ...
Next: a collective in an exit handler (atexit) runs only where that handler finds work ...".
"""
LAUNCH = "torchrun"
NPROC = 3
EXPECT = {"kind": "skipped-collective", "culprit_ranks": [1], "cause": "extra-collective",
          "says": ("in an exit handler", "the program caught the error")}

import atexit
import json
import logging
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

logging.basicConfig(level=logging.INFO,
                    format="%(asctime)s rank%(rank)s %(levelname)s %(message)s")
OUT_DIR = os.environ.get("METRICS_DIR", "/tmp/blind87/metrics")


class RankFilter(logging.Filter):
    def filter(self, record):
        record.rank = os.environ.get("RANK", "?")
        return True


log = logging.getLogger("train")
log.addFilter(RankFilter())


class MetricsLogger:
    """The team's metrics logger: buffers counters, flushes at exit."""

    def __init__(self, path):
        self.path = path
        self.buffer = []          # pending (name, value) entries
        self.flushed_upto = 0
        atexit.register(self.flush_metrics)

    def log(self, name, value):
        self.buffer.append((name, float(value)))

    def periodic_flush(self, step):
        # flushes locally every 5 steps; rank 1 logs extra "slow batch"
        # counters after the last periodic flush, so its buffer stays non-empty
        if step % 5 == 4:
            self.buffer.clear()

    def flush_metrics(self):
        if not self.buffer:
            return
        try:
            counters = torch.tensor([len(self.buffer),
                                     sum(v for _, v in self.buffer)],
                                    dtype=torch.float64)
            # "to aggregate the final numbers"
            dist.all_reduce(counters, op=dist.ReduceOp.SUM)
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            with open(self.path, "w") as f:
                json.dump({"entries": counters[0].item(),
                           "total": counters[1].item()}, f)
        except Exception as e:  # noqa: BLE001
            log.warning("metrics flush failed: %r", e)
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()


class Toy(Dataset):
    def __init__(self, n=20 * 8 * 3):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 16, generator=g)
        self.y = torch.randn(n, 1, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    metrics = MetricsLogger(os.path.join(OUT_DIR, "final_metrics.json"))

    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ds = Toy()
    sampler = DistributedSampler(ds, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=8, sampler=sampler, num_workers=2)

    steps = 20
    it = iter(loader)
    for step in range(steps):
        x, y = next(it)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        metrics.log("loss", loss.item())
        metrics.periodic_flush(step)
        if rank == 1 and step == steps - 1:
            # rank 1's data shard had a slow last batch: extra counter buffered
            metrics.log("slow_batches", 1)
        if step % 5 == 0:
            log.info("step %d loss %.4f", step, loss.item())

    log.info("training done, buffered metrics: %d", len(metrics.buffer))
    if metrics.buffer:
        # the logger still needs the group for its final flush; it tears the
        # group down itself after flushing (see flush_metrics)
        return
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    sys.exit(0)
