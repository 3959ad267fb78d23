"""A trainer actor is SIGTERMed from outside while its memory is low; its peer waits in all_reduce.

Incident (the founding report): two Trainer actors form a gloo group (ranks 0 and 1). At step 3
something outside the job (here the driver, standing in for a preemption / kubelet / operator)
sends SIGTERM to rank 1's worker while it uses ~a few hundred MiB. Rank 0 is already inside the
step's all_reduce. Ray reports the actor as dead with its generic "worker process has died ...
may have exceeded K8s pod memory limits" text. A good tool: dead-rank, rank 1, SIGTERM from
outside, "not an OOM", and shows Ray's own death text beside it.
"""
import os
import signal
import socket
import time
from datetime import timedelta

import ray

LAUNCH = "ray"
EXPECT = {"kind": "dead-rank", "culprit_ranks": [1], "culprit_actors": ["trainer-1"],
          "cause": "sigterm-external"}


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
        torch.manual_seed(rank)
        self.model = torch.nn.Linear(256, 256)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)

    def get_pid(self):
        return os.getpid()

    def train_step(self, step):
        import torch
        import torch.distributed as dist
        try:
            from hangtrace import tracer
            tracer.step(step)
        except ImportError:
            pass
        # rank 1's data loading is slower, so rank 0 enters the all_reduce first
        time.sleep(0.2 if self.rank == 0 else 2.0)
        x = torch.randn(64, 256)
        loss = self.model(x).pow(2).mean()
        self.opt.zero_grad()
        loss.backward()
        for p in self.model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        self.opt.step()
        dist.all_reduce(loss.detach().clone())
        return loss.item()


def main():
    ray.init(address="local", num_cpus=4, include_dashboard=False, runtime_env={"env_vars": tracing_env()})
    port = free_port()
    trainers = [Trainer.options(name=f"trainer-{r}").remote(r, 2, "127.0.0.1", port) for r in range(2)]
    pids = ray.get([t.get_pid.remote() for t in trainers], timeout=120)
    print(time.strftime("%H:%M:%S"), f"[driver] trainers up, pids {pids}", flush=True)
    try:
        for step in range(1, 7):
            refs = [t.train_step.remote(step) for t in trainers]
            if step == 3:
                time.sleep(1.0)
                print(time.strftime("%H:%M:%S"), f"[driver] step 3: sending SIGTERM to trainer-1 (pid {pids[1]})", flush=True)
                os.kill(pids[1], signal.SIGTERM)
            losses = ray.get(refs, timeout=120)
            print(time.strftime("%H:%M:%S"), f"[driver] step {step} done, loss {losses[0]:.4f}", flush=True)
    except Exception as e:  # noqa: BLE001 - report like the real driver did
        print(time.strftime("%H:%M:%S"), f"[driver] training failed: {type(e).__name__}: {str(e)[:600]}", flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
