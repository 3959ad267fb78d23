"""A Ray driver: a rank-less Rollout actor and two Trainer actors in a gloo group (ranks 0-1).

At step 3 rank 1's worker is SIGTERMed from outside (``os.kill`` from a thread of the
driver, standing in for a user or a preemption): ``idle`` - before the step's rollout, while
the trainers are between ``train`` calls (Ray's handler then exits it with code 0); ``train``
- 0.5 s into the step's ``train``. The driver's ``ray.get`` fails with ActorDiedError and it
calls ``ray.shutdown()``, whose raylet SIGTERMs the Rollout and rank 0 (issue 38, item 5).
``kill`` - rank 1 SIGKILLed 0.5 s into step 3's ``train`` (as the kernel's OOM killer would),
then the same teardown; ``none`` - no fault: 7 steps, then ``ray.shutdown()`` (a clean run,
for the start-up grace under load).
Usage: ``python ray_sigterm_trainer.py idle|train|kill|none``.
"""

import os
import signal
import socket
import sys
import threading
import time
from datetime import timedelta

import ray


def tracing_env():
    return {k: v for k, v in os.environ.items() if k.startswith("HANGTRACE")}


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@ray.remote
class Rollout:
    def generate(self, step):
        time.sleep(0.3)
        return [float(step)] * 8

    def pid(self):
        return os.getpid()


@ray.remote
class Trainer:
    def __init__(self, rank, world, port):
        import torch.distributed as dist

        os.environ.update(
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world)
        )
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))

    def pid(self):
        return os.getpid()

    def train(self, step, data):
        import torch
        import torch.distributed as dist

        for _ in range(40):
            t = torch.tensor(data)
            dist.all_reduce(t)
            time.sleep(0.05)
        return float(t.sum())


def main(when):
    ray.init(num_cpus=4, include_dashboard=False, runtime_env={"env_vars": tracing_env()})
    port = free_port()
    rollout = Rollout.options(name="rollout").remote()
    trainers = [Trainer.options(name="trainer-%d" % r).remote(r, 2, port) for r in range(2)]
    pids = ray.get([t.pid.remote() for t in trainers] + [rollout.pid.remote()], timeout=180)
    print("[driver] pids", pids, flush=True)

    def kill(delay):
        time.sleep(delay)
        sig = signal.SIGKILL if when == "kill" else signal.SIGTERM
        print("[driver] %s to rank 1 (pid %d)" % (sig.name, pids[1]), flush=True)
        os.kill(pids[1], sig)

    try:
        for step in range(1, 8):
            if step == 3 and when == "idle":
                kill(0)
            data = ray.get(rollout.generate.remote(step), timeout=60)
            refs = [t.train.remote(step, data) for t in trainers]
            if step == 3 and when in ("train", "kill"):
                threading.Thread(target=kill, args=(0.5,)).start()
            print("[driver] step", step, ray.get(refs, timeout=60), flush=True)
    except Exception as e:  # noqa: BLE001 - as an RL driver does
        print("[driver] failed: %s: %s" % (type(e).__name__, str(e)[:300]), flush=True)
    ray.shutdown()
    print("[driver] shut down", flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "idle")
