"""Weight-sync broadcast where one inference engine never joins.

Incident (OpenRLHF / verl weight sync in spirit): trainer rank 0 broadcasts new weights to two
rollout engines over a gloo "weight sync" group (trainer = rank 0, engine-0 = rank 1,
engine-1 = rank 2). The driver uses partial rollouts: it takes whatever generate() calls finish
within a deadline. At step 2 engine-1's generate() is stuck waiting for a detokenizer thread that
died, so the driver moves on without it; engine-1's update_weights() call then queues behind the
stuck generate() (max_concurrency=1) and never enters the broadcast. Trainer and engine-0 wait
in it. A good tool: stuck-outside-collective, rank 2 / engine-1, blocked (Event.wait in generate).
"""
import os
import socket
import threading
import time
from datetime import timedelta

import ray

LAUNCH = "ray"
EXPECT = {"kind": "stuck-outside-collective", "culprit_ranks": [2], "culprit_actors": ["engine-1"],
          "cause": "blocked"}


def tracing_env():
    return {k: v for k, v in os.environ.items() if k.startswith("HANGTRACE")}


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def init_group(rank, world_size, addr, port):
    os.environ.update(MASTER_ADDR=addr, MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size))
    import torch.distributed as dist
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=90))


@ray.remote
class Trainer:
    def __init__(self, world_size, addr, port):
        import torch
        init_group(0, world_size, addr, port)
        torch.manual_seed(0)
        self.model = torch.nn.Linear(32, 32)

    def ready(self):
        return os.getpid()

    def train(self, step, samples):
        import torch
        try:
            from hangtrace import tracer
            tracer.step(step)
        except ImportError:
            pass
        x = torch.tensor(samples, dtype=torch.float32).reshape(-1, 1).expand(-1, 32)
        loss = self.model(x).pow(2).mean()
        loss.backward()
        with torch.no_grad():
            for p in self.model.parameters():
                p -= 0.01 * p.grad
                p.grad = None
        return loss.item()

    def broadcast_weights(self):
        import torch.distributed as dist
        for p in self.model.parameters():
            dist.broadcast(p.data, src=0)
        return True


@ray.remote(max_concurrency=1)
class Engine:
    def __init__(self, rank, world_size, addr, port, name):
        import torch
        init_group(rank, world_size, addr, port)
        self.name = name
        self.weights = [torch.zeros(32, 32), torch.zeros(32)]
        self.n_calls = 0

    def ready(self):
        return os.getpid()

    def generate(self, prompts):
        self.n_calls += 1
        if self.name == "engine-1" and self.n_calls == 2:
            done = threading.Event()

            def detokenize():
                raise RuntimeError("detokenizer: invalid utf-8 in output ids")  # thread dies, never sets done

            threading.Thread(target=detokenize, name="detokenizer", daemon=True).start()
            done.wait()  # waits forever for the detokenized output
        time.sleep(0.3)
        return [float(p) * 0.5 for p in prompts]

    def update_weights(self):
        import torch.distributed as dist
        for w in self.weights:
            dist.broadcast(w, src=0)
        return True


def main():
    ray.init(address="local", num_cpus=4, include_dashboard=False, runtime_env={"env_vars": tracing_env()})
    port = free_port()
    trainer = Trainer.options(name="trainer").remote(3, "127.0.0.1", port)
    engines = [Engine.options(name=f"engine-{i}").remote(i + 1, 3, "127.0.0.1", port, f"engine-{i}")
               for i in range(2)]
    print(time.strftime("%H:%M:%S"), f"[driver] up: {ray.get([trainer.ready.remote()] + [e.ready.remote() for e in engines], timeout=120)}",
          flush=True)
    try:
        for step in range(1, 6):
            refs = [e.generate.remote([step * 10 + j for j in range(4)]) for e in engines]
            done, _ = ray.wait(refs, num_returns=len(refs), timeout=5)  # partial rollout: take what finished
            samples = [s for r in done for s in ray.get(r)]
            if len(done) < len(refs):
                print(time.strftime("%H:%M:%S"), f"[driver] step {step}: only {len(done)}/{len(refs)} engines answered; training on partial rollout",
                      flush=True)
            loss = ray.get(trainer.train.remote(step, samples), timeout=60)
            ray.get([trainer.broadcast_weights.remote()] + [e.update_weights.remote() for e in engines], timeout=120)
            print(time.strftime("%H:%M:%S"), f"[driver] step {step} loss {loss:.4f}, weights synced", flush=True)
    except Exception as e:  # noqa: BLE001
        print(time.strftime("%H:%M:%S"), f"[driver] failed: {type(e).__name__}: {str(e)[:400]}", flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
