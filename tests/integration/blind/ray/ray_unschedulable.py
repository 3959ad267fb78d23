"""An actor that can never be scheduled: the driver waits forever for its address.

Incident (verl #7656 in spirit): the rollout engine actor is created with num_gpus=1 (copied from
a GPU config) on a cluster that has no GPU. Ray keeps it PENDING_CREATION and only logs an
autoscaler warning; the driver blocks in ray.get(engine.get_address.remote()). The Trainer actor
is up and idle. No process died, nobody is in a collective. The vocabulary has no word for it;
a good tool should say "unschedulable-actor" (proposal), naming RolloutEngine and {GPU: 1}.
"""
import os
import socket
import time

import ray

LAUNCH = "ray"
EXPECT = {"kind": "unschedulable-actor", "kind_is_proposal": True, "culprit_ranks": [],
          "culprit_actors": ["rollout-engine"], "cause": None}


def tracing_env():
    return {k: v for k, v in os.environ.items() if k.startswith("HANGTRACE")}


@ray.remote
class Trainer:
    def ready(self):
        return socket.gethostname()


@ray.remote
class RolloutEngine:
    def __init__(self, model):
        self.model = model

    def get_address(self):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        return f"127.0.0.1:{port}"


def main():
    ray.init(address="local", num_cpus=4, include_dashboard=False, runtime_env={"env_vars": tracing_env()})
    trainer = Trainer.remote()
    print(time.strftime("%H:%M:%S"), f"[driver] trainer ready on {ray.get(trainer.ready.remote(), timeout=60)}", flush=True)
    engine = RolloutEngine.options(num_gpus=1, name="rollout-engine").remote("qwen-0.5b")
    print(time.strftime("%H:%M:%S"), "[driver] waiting for the rollout engine's address ...", flush=True)
    try:
        addr = ray.get(engine.get_address.remote(), timeout=120)
        print(time.strftime("%H:%M:%S"), f"[driver] engine at {addr}")
    except ray.exceptions.GetTimeoutError:
        print(time.strftime("%H:%M:%S"), "[driver] rollout engine never came up within 120 s", flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
