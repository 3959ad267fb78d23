"""Incident (pith-train PR 31 / torchtitan PR 1342): the trainer wraps training in
try/finally and the finally-block "cleans up" with a final dist.barrier() before
destroy_process_group(). At step 3 rank 1 raises (a bad checkpoint-resume assertion) inside
training; its finally-block then blocks in the teardown barrier, so rank 1 never exits and
the launcher never sees a death, while rank 0 waits in the training all_reduce of step 3.
torchrun, 2 ranks, DataLoader with 2 persistent workers, phases/steps instrumented.
"""
LAUNCH = "torchrun"
NPROC = 2
EXPECT = {"kind": "dead-rank", "culprit_ranks": [1], "cause": "exception"}

import datetime
import os
import subprocess
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

from hangtrace import tracer


class Tokens(Dataset):
    def __len__(self):
        return 96

    def __getitem__(self, i):
        return torch.randint(0, 100, (12,))


class Trainer:
    def __init__(self):
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.emb = torch.nn.Embedding(100, 16)
        self.head = torch.nn.Linear(16, 100)
        self.params = list(self.emb.parameters()) + list(self.head.parameters())
        self.opt = torch.optim.AdamW(self.params, lr=1e-3)
        self.loader = DataLoader(Tokens(), batch_size=4, num_workers=2, persistent_workers=True)
        self.lr_state = {"step": 0}

    def train(self, steps):
        it = iter(self.loader)
        for step in range(1, steps + 1):
            tracer.step(step)
            with tracer.phase("train"):
                tok = next(it)
                logits = self.head(self.emb(tok[:, :-1]))
                loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 100), tok[:, 1:].reshape(-1))
                self.opt.zero_grad()
                loss.backward()
                if self.rank == 1 and step == 3:
                    # e.g. the LR scheduler state restored from the checkpoint is inconsistent
                    raise AssertionError(f"lr scheduler step {self.lr_state['step']} != optimizer step {step - 1}")
                self.lr_state["step"] = step
                for p in self.params:
                    dist.all_reduce(p.grad)
                self.opt.step()
            print(f"rank {self.rank} step {step} loss {loss.item():.3f}", flush=True)
            time.sleep(0.2)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank = dist.get_rank()
    print(f"rank {rank} pid {os.getpid()} up", flush=True)
    subprocess.run(["hostname"], capture_output=True)
    trainer = Trainer()
    try:
        trainer.train(6)
    finally:
        # "make sure every rank is done before tearing down" -- hangs if we got here by an exception
        with tracer.phase("teardown"):
            print(f"rank {rank} teardown: final barrier", flush=True)
            dist.barrier()
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
