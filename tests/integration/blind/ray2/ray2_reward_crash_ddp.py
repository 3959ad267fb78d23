"""The reward worker's scoring thread raises and the worker exits; the gloo trainers hang.

Incident (OpenRLHF/verl-style remote reward model): two Trainer actors form a gloo process
group (ranks 0 and 1, init_process_group inside the actors). A RewardWorker actor (no rank)
scores batches in a background thread that prefetches ahead of the trainers; its loop is
wrapped "fail fast": on any exception it prints the traceback and calls os._exit(3) so that
Ray would restart it (max_restarts is 0 here, so it stays dead). At step 5 the reward model
produces NaN scores and the thread raises ValueError("reward model produced NaN scores ...");
the worker process exits with code 3. Rank 0, which fetches each step's batch with
ray.get(reward.next_batch.remote()) and broadcasts it, gets ActorDiedError out of its
train_step; rank 1 waits in broadcast_object_list for rank 0 (gloo timeout 120 s). The
driver waits for both trainers with ray.wait(num_returns=2), which does not stop at the
failed one, and keeps printing "still waiting" until it gives up after 120 s.

EXPECTED verdict: kind dead-rank; culprit_ranks [] (the culprit has no rank); culprit_actors
RewardWorker 'reward-worker'; cause exception (the scoring thread's ValueError, then exit 3).
Ranks 0 and 1 are cascade (rank 0's ActorDiedError, rank 1 in broadcast).
"""
import os
import queue
import socket
import threading
import time
import traceback
from datetime import timedelta

import ray

LAUNCH = "ray"
EXPECT = {"kind": "dead-rank", "culprit_ranks": [], "culprit_actors": ["RewardWorker 'reward-worker'"],
          "cause": "exception"}

FAIL_AT = 5


def tracing_env():
    return {k: v for k, v in os.environ.items() if k.startswith("HANGTRACE")}


def log(msg):
    print(time.strftime("%H:%M:%S"), f"[driver] {msg}", flush=True)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@ray.remote(max_concurrency=2)
class RewardWorker:
    def __init__(self, batch_size=8, dim=16):
        import torch
        self.torch = torch
        self.rm = torch.nn.Sequential(torch.nn.Linear(dim, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
        self.batch_size, self.dim = batch_size, dim
        self.requests = queue.Queue()
        self.thread = threading.Thread(target=self._score_loop, name="reward-scorer", daemon=True)
        self.thread.start()

    def _score_loop(self):
        # the scoring engine thread: serves requests one at a time (a batching loop in real life)
        torch = self.torch
        try:
            n = 0
            while True:
                reply = self.requests.get()
                n += 1
                x = torch.randn(self.batch_size, self.dim)
                with torch.no_grad():
                    scores = self.rm(x).squeeze(-1)
                if n == FAIL_AT:
                    scores[3] = float("nan")
                if torch.isnan(scores).any():
                    raise ValueError(f"reward model produced NaN scores for batch {n}")
                time.sleep(0.3)
                reply.put({"step": n, "x": x.tolist(), "r": scores.tolist()})
                print(f"[reward] scored batch {n}", flush=True)
        except Exception:  # noqa: BLE001
            traceback.print_exc()
            print("[reward] scorer thread failed; exiting so Ray can restart the worker", flush=True)
            os._exit(3)

    def next_batch(self):
        reply = queue.Queue(maxsize=1)
        self.requests.put(reply)
        return reply.get()


@ray.remote
class Trainer:
    def __init__(self, rank, world_size, master_addr, master_port):
        os.environ.update(MASTER_ADDR=master_addr, MASTER_PORT=str(master_port),
                          RANK=str(rank), WORLD_SIZE=str(world_size))
        import torch
        import torch.distributed as dist
        dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=120))
        self.rank = rank
        torch.manual_seed(0)
        self.model = torch.nn.Linear(16, 1)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)

    def ready(self):
        return os.getpid()

    def train_step(self, step, reward):
        import torch
        import torch.distributed as dist
        try:
            from hangtrace import tracer
            tracer.step(step)
        except ImportError:
            pass
        obj = [None]
        if self.rank == 0:
            obj[0] = ray.get(reward.next_batch.remote())
        dist.broadcast_object_list(obj, src=0)
        batch = obj[0]
        x = torch.tensor(batch["x"])
        r = torch.tensor(batch["r"])
        loss = ((self.model(x).squeeze(-1) - r) ** 2).mean()
        self.opt.zero_grad()
        loss.backward()
        for p in self.model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        self.opt.step()
        return loss.item()


def main():
    ray.init(address="local", num_cpus=4, include_dashboard=False,
             runtime_env={"env_vars": tracing_env()})
    port = free_port()
    reward = RewardWorker.options(name="reward-worker", max_restarts=0).remote()
    trainers = [Trainer.options(name=f"trainer-{r}").remote(r, 2, "127.0.0.1", port) for r in range(2)]
    log(f"trainers up, pids {ray.get([t.ready.remote() for t in trainers], timeout=120)}")
    for step in range(1, 11):
        refs = [t.train_step.remote(step, reward) for t in trainers]
        t0 = time.time()
        pending = refs
        while pending and time.time() - t0 < 120:
            _, pending = ray.wait(refs, num_returns=len(refs), timeout=15)
            if pending:
                log(f"step {step}: still waiting for {len(pending)} of {len(refs)} trainers "
                    f"({time.time() - t0:.0f}s)")
        if pending:
            log(f"step {step}: trainers did not finish within 120 s; giving up")
            break
        try:
            losses = ray.get(refs)
            log(f"step {step} loss {losses[0]:.4f}")
        except Exception as e:  # noqa: BLE001
            log(f"step {step} failed: {type(e).__name__}: {str(e)[:300]}")
            break
    ray.shutdown()
    log("shut down")


if __name__ == "__main__":
    main()
