"""Trainer rank 0 raises in train_step; rank 1 waits in all_reduce; the driver's error path hangs.

Incident: two Trainer actors in a gloo group. At step 4 rank 0 finds a NaN loss and raises
ValueError("loss is NaN at step 4") before its gradient all_reduce. Ray returns
RayTaskError(ValueError) to the driver at once, but the actor stays alive; rank 1 sits in the
all_reduce. The driver's failure handler asks every trainer for an emergency checkpoint, and
rank 1's call queues behind its stuck train_step, so the job hangs instead of exiting.
A good tool: dead-rank (rank 0's step died of an exception), rank 0, names the ValueError.
"""
import os
import socket
import tempfile
import time
from datetime import timedelta

import ray

LAUNCH = "ray"
EXPECT = {"kind": "dead-rank", "culprit_ranks": [0], "culprit_actors": ["trainer-0"], "cause": "exception"}


def tracing_env():
    return {k: v for k, v in os.environ.items() if k.startswith("HANGTRACE")}


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@ray.remote
class Trainer:
    def __init__(self, rank, world_size, master_addr, master_port):
        self.rank = rank
        os.environ.update(MASTER_ADDR=master_addr, MASTER_PORT=str(master_port),
                          RANK=str(rank), WORLD_SIZE=str(world_size))
        import torch
        import torch.distributed as dist
        dist.init_process_group("gloo", rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=90))
        torch.manual_seed(0)
        self.model = torch.nn.Linear(128, 1)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)

    def ready(self):
        return os.getpid()

    def train_step(self, step):
        import torch
        import torch.distributed as dist
        try:
            from hangtrace import tracer
            tracer.step(step)
        except ImportError:
            pass
        x = torch.randn(32, 128) * (1 + self.rank)
        loss = self.model(x).pow(2).mean()
        if self.rank == 0 and step == 4:
            loss = loss * float("nan")  # a bad batch on this rank
        if not torch.isfinite(loss):
            raise ValueError(f"loss is NaN at step {step}")
        self.opt.zero_grad()
        loss.backward()
        for p in self.model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        self.opt.step()
        return loss.item()

    def save_checkpoint(self, path):
        import torch
        torch.save(self.model.state_dict(), os.path.join(path, f"rank{self.rank}.pt"))
        return path


def main():
    ray.init(address="local", num_cpus=4, include_dashboard=False, runtime_env={"env_vars": tracing_env()})
    port = free_port()
    trainers = [Trainer.options(name=f"trainer-{r}").remote(r, 2, "127.0.0.1", port) for r in range(2)]
    print(time.strftime("%H:%M:%S"), f"[driver] trainers up, pids {ray.get([t.ready.remote() for t in trainers], timeout=120)}", flush=True)
    ckpt_dir = tempfile.mkdtemp(prefix="emergency-ckpt-")
    try:
        for step in range(1, 8):
            losses = ray.get([t.train_step.remote(step) for t in trainers], timeout=120)
            print(time.strftime("%H:%M:%S"), f"[driver] step {step} loss {losses[0]:.4f}", flush=True)
            time.sleep(0.2)
    except Exception as e:  # noqa: BLE001
        print(time.strftime("%H:%M:%S"), f"[driver] training failed: {type(e).__name__}: {str(e)[:400]}", flush=True)
        print(time.strftime("%H:%M:%S"), "[driver] saving an emergency checkpoint on every trainer ...", flush=True)
        try:
            ray.get([t.save_checkpoint.remote(ckpt_dir) for t in trainers], timeout=120)
            print(time.strftime("%H:%M:%S"), "[driver] emergency checkpoint saved", flush=True)
        except Exception as e2:  # noqa: BLE001
            print(time.strftime("%H:%M:%S"), f"[driver] emergency checkpoint failed: {type(e2).__name__}: {str(e2)[:300]}", flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
