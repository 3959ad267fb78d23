"""Two gloo trainer actors (``max_restarts=1``); trainer 1 is SIGKILLed from outside in step 5
(a stand-in for the node's OOM killer); Ray restarts it, and its ``__init__`` calls
``init_process_group`` again, which trainer 0 never joins (its group still holds the dead
process; its all_reduce failed with "Connection closed by peer"). The driver catches the
error, waits for the trainers to answer and retries the step; it gives up after 40 s.

Written blind on 2026-12-04 by a helper that had read only the README and docs/RAY.md
(helper 73). First verdicts: the death (run 4) or, when the death snapshot came after the
restart, the restarted process "stuck outside collectives" in init_process_group with "Rank 0
waits for it in all_reduce seq 11" (false: that all_reduce had failed); after the run,
"Skipped collective". Fixed: a rank restarted alone is analysed by the process that died
(analyze/lonerestart.py), with its replacement described and advice to restart the group
together. For the corpus: ray.init with the job's HANGTRACE variables in runtime_env (the
harness's way), address="local", and a 40 s readiness deadline instead of 120 s.

EXPECTED verdict: kind dead-rank; culprit rank 1 (Trainer 'trainer-1'); cause
killed-without-record.
"""
LAUNCH = "ray"
EXPECT = {"kind": "dead-rank", "culprit_ranks": [1], "culprit_actors": ["Trainer 'trainer-1'"],
          "cause": "killed-without-record",
          "summary_has": "Trainer 'trainer-1'"}

import argparse
import os
import signal
import socket
import threading
import time


import ray


@ray.remote(max_restarts=1, max_task_retries=0, num_cpus=1)
class Trainer:
    def __init__(self, rank, world_size, init_method):
        import torch
        import torch.distributed as dist
        self.rank = rank
        self.restarted = ray.get_runtime_context().was_current_actor_reconstructed
        print(f"[trainer {rank}] pid {os.getpid()} setup (restarted={self.restarted}) "
              f"init_process_group {init_method}", flush=True)
        dist.init_process_group("gloo", rank=rank, world_size=world_size,
                                init_method=init_method)
        torch.manual_seed(0)
        self.model = torch.nn.Linear(16, 4)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        print(f"[trainer {rank}] process group ready", flush=True)

    def pid(self):
        return os.getpid()

    def train_step(self, step):
        import torch
        import torch.distributed as dist
        x = torch.randn(32, 16)
        # rank 1 has a heavier data/forward path this step (e.g. long sequences)
        time.sleep(1.5 if self.rank == 1 else 0.1)
        loss = self.model(x).pow(2).mean()
        self.opt.zero_grad()
        loss.backward()
        for p in self.model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        self.opt.step()
        return float(loss)


def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close()
    return p


def wait_ready(actors, deadline_s=40):
    t_end = time.time() + deadline_s
    while True:
        try:
            return ray.get([a.pid.remote() for a in actors])
        except (ray.exceptions.ActorUnavailableError,
                ray.exceptions.GetTimeoutError) as e:
            if time.time() > t_end:
                raise
            print(f"driver: not ready yet ({type(e).__name__}), waiting", flush=True)
            time.sleep(1.0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--kill-step", type=int, default=5)
    args = ap.parse_args()

    ray.init(address="local", num_cpus=4, include_dashboard=False,
             runtime_env={"env_vars": {k: v for k, v in os.environ.items() if k.startswith("HANGTRACE")}})
    init_method = f"tcp://127.0.0.1:{free_port()}"
    actors = [Trainer.options(name=f"trainer-{r}").remote(r, 2, init_method)
              for r in range(2)]
    pids = ray.get([a.pid.remote() for a in actors])
    print(f"driver: trainer pids {pids}", flush=True)

    step = 0
    retries = 0
    while step < args.steps:
        if step == args.kill_step and pids is not None:
            victim = pids[1]
            def oom_killer():
                time.sleep(0.5)
                print(f"driver: [simulated OOM killer] SIGKILL trainer 1 pid {victim}",
                      flush=True)
                os.kill(victim, signal.SIGKILL)
            threading.Thread(target=oom_killer, daemon=True).start()
            pids = None  # kill once
        t0 = time.time()
        print(f"driver: step {step} start", flush=True)
        try:
            losses = ray.get([a.train_step.remote(step) for a in actors])
        except ray.exceptions.RayError as e:  # actor died, or peer's collective failed
            print(f"driver: step {step} failed: {type(e).__name__}: "
                  f"{str(e).splitlines()[0][:300]}", flush=True)
            retries += 1
            if retries > 3:
                raise
            # wait until Ray has restarted any dead trainer (its __init__ re-ran setup)
            print("driver: waiting for trainers to be alive again", flush=True)
            print(f"driver: trainer pids now {wait_ready(actors)}", flush=True)
            print(f"driver: retrying step {step}", flush=True)
            continue
        print(f"driver: step {step} done losses {losses} ({time.time()-t0:.2f}s)",
              flush=True)
        step += 1
    print("driver: done", flush=True)


if __name__ == "__main__":
    main()
