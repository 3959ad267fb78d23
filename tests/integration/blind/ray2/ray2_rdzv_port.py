"""A Ray trainer group whose second actor rendezvouses at another port: both hang in init.

Incident (verl/OpenRLHF-style trainer group): the driver creates two Trainer actors, tells
each its rank and world size 2, and is supposed to pass both the MASTER_ADDR/MASTER_PORT it
picked. Bug: it passes the port to actor 0 only; actor 1 picks its own free port. Each
actor calls init_process_group("gloo", init_method="env://") in an actor method; the driver
waits on both with ray.get. Neither actor ever leaves the rendezvous.

EXPECTED verdict: the ranks are stuck in the rendezvous (kind unknown, cause
stalled-in-rendezvous); culprit rank 1, Trainer 'trainer-1': its store address differs from
rank 0's, and rank 0 hosts the store.

Written blind by a helper (2026-12-02) from this description and the README (there with a
--runtime-env-json argument from `hangtrace env --ray`; here the corpus's tracing_env()).
"""
import os
import socket

import ray

LAUNCH = "ray"
EXPECT = {"kind": "unknown", "culprit_ranks": [1], "culprit_actors": ["Trainer 'trainer-1'"],
          "cause": "stalled-in-rendezvous"}
STARTUP_STALL_S = 15


def tracing_env():
    return {k: v for k, v in os.environ.items() if k.startswith("HANGTRACE")}


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


@ray.remote(num_cpus=1)
class Trainer:
    def __init__(self, rank, world_size):
        self.rank, self.world_size = rank, world_size

    def init_group(self, master_addr, master_port=None):
        import torch.distributed as dist
        if master_port is None:          # BUG: actor 1 is not given the port and picks its own
            master_port = free_port()
        os.environ.update(MASTER_ADDR=master_addr, MASTER_PORT=str(master_port),
                          RANK=str(self.rank), WORLD_SIZE=str(self.world_size))
        print(f"trainer {self.rank} pid {os.getpid()} -> {master_addr}:{master_port}", flush=True)
        dist.init_process_group("gloo", init_method="env://")
        return self.rank


if __name__ == "__main__":
    ray.init(address="local", num_cpus=2, include_dashboard=False, runtime_env={"env_vars": tracing_env()})
    trainers = [Trainer.options(name=f"trainer-{r}").remote(r, 2) for r in range(2)]
    addr, port = "127.0.0.1", free_port()
    print(f"driver pid {os.getpid()} picked {addr}:{port}", flush=True)
    refs = [trainers[0].init_group.remote(addr, port),
            trainers[1].init_group.remote(addr)]       # BUG: port not passed to actor 1
    print("driver: waiting for the trainer group to form", flush=True)
    try:
        print(ray.get(refs, timeout=240), flush=True)
    finally:
        ray.shutdown()
