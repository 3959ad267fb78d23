"""A verl-style trainer actor is preempted: its SIGTERM handler ends train() and the actor idles.

Incident (blind helper 95, 2026-12-04, run by a user as `hangtrace run --stall-s 15 -- python
driver.py`): a driver and three TrainActor Ray actors (ranks 0-2) in one gloo group; each actor
installs a graceful-shutdown SIGTERM handler that sets a flag, checked at the top of every step:
when set, train() saves a checkpoint and returns a dict. A node agent (a separate process)
SIGTERMs rank 1 alone after 10 s. Rank 1's train() returns; its actor process lives on, idle in
Ray's task loop, its gloo connections open, so ranks 0 and 2 hang in their next all_reduce
(until gloo's 60 s timeout). A good tool: rank 1 skipped the collective: its method returned
after the SIGTERM (its sender named), the actor is idle; not "blocked in epoll_wait".

Corpus changes to the job as written (what the harness needs, nothing else): the node agent's
six lines are embedded (NODE_AGENT) and run with `python -c` instead of from a file beside the
job; Ray is started with address="local" (never another session's cluster) and the HANGTRACE
environment is passed to the workers through runtime_env by default (the job took it as
--runtime-env-json); the checkpoints go to a temp directory.
"""
import argparse, json, os, socket, subprocess, sys, tempfile, time

LAUNCH = "ray"
EXPECT = {"kind": "skipped-collective", "culprit_ranks": [1], "culprit_actors": ["TrainActor"], "cause": "skipped",
          "summary_has": "its actor method TrainActor.train returned"}

NODE_AGENT = r"""
# Simulates a node agent (preemption notice): sleeps, then SIGTERMs one pid.
import os, signal, sys, time
pid, delay = int(sys.argv[1]), float(sys.argv[2])
time.sleep(delay)
print(f"[node_agent pid {os.getpid()}] sending SIGTERM to {pid}", flush=True)
os.kill(pid, signal.SIGTERM)
"""
import ray

@ray.remote(num_cpus=0)
class TrainActor:
    def __init__(self, rank, world_size, master_addr, master_port):
        import signal
        self.rank = rank
        os.environ["RANK"] = str(rank)
        os.environ["WORLD_SIZE"] = str(world_size)
        os.environ["LOCAL_RANK"] = str(rank)
        os.environ["MASTER_ADDR"] = master_addr
        os.environ["MASTER_PORT"] = str(master_port)
        self.stop_requested = False
        def _on_sigterm(signum, frame):
            print(f"[rank {self.rank}] got SIGTERM, will stop at next step", flush=True)
            self.stop_requested = True
        signal.signal(signal.SIGTERM, _on_sigterm)

    def get_pid(self):
        return os.getpid()

    def init_dist(self):
        import datetime
        import torch, torch.distributed as dist
        torch.set_num_threads(1)
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
        return dist.get_rank()

    def train(self, steps=100000, ckpt_dir=os.path.join(tempfile.gettempdir(), "ray_preempted_actor_returns")):
        import torch, torch.distributed as dist
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        ws = dist.get_world_size()
        loss = None
        for step in range(steps):
            if self.stop_requested:
                os.makedirs(ckpt_dir, exist_ok=True)
                path = f"{ckpt_dir}/rank{self.rank}_step{step}.pt"
                torch.save(model.state_dict(), path)
                print(f"[rank {self.rank}] graceful stop at step {step}, saved {path}", flush=True)
                return {"rank": self.rank, "stopped_at": step, "ckpt": path, "preempted": True}
            x = torch.randn(256, 64)
            y = x.sum(dim=1, keepdim=True)
            for _ in range(20):  # some CPU compute
                torch.mm(torch.randn(128, 128), torch.randn(128, 128))
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= ws
            opt.step()
            if step % 20 == 0:
                print(f"[rank {self.rank}] step {step} loss {loss.item():.4f}", flush=True)
            time.sleep(0.05)
        return {"rank": self.rank, "stopped_at": steps, "preempted": False}

def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runtime-env-json", default=None)
    ap.add_argument("--victim", type=int, default=1)
    ap.add_argument("--kill-after", type=float, default=10.0)
    args = ap.parse_args()
    rt = json.loads(args.runtime_env_json) if args.runtime_env_json else None
    rt = rt or {"env_vars": {k: v for k, v in os.environ.items() if k.startswith("HANGTRACE")}}
    ray.init(address="local", num_cpus=2, runtime_env=rt, include_dashboard=False)
    ws = 3
    addr, port = "127.0.0.1", free_port()
    actors = [TrainActor.remote(r, ws, addr, port) for r in range(ws)]
    pids = ray.get([a.get_pid.remote() for a in actors])
    print(f"driver: actor pids {pids}", flush=True)
    print("driver: ranks", ray.get([a.init_dist.remote() for a in actors]), flush=True)
    futs = [a.train.remote() for a in actors]
    agent = subprocess.Popen([sys.executable, "-c", NODE_AGENT, str(pids[args.victim]), str(args.kill_after)])
    t0 = time.time()
    try:
        res = ray.get(futs, timeout=120)
        print("driver: all results", res, flush=True)
    except Exception as e:
        print(f"driver: ray.get failed after {time.time()-t0:.1f}s: {type(e).__name__}: {e}", flush=True)
        for i, f in enumerate(futs):
            try:
                print(f"driver: rank {i} ->", ray.get(f, timeout=1), flush=True)
            except Exception as e2:
                print(f"driver: rank {i} -> {type(e2).__name__}: {str(e2)[:600]}", flush=True)
    agent.wait()
    ray.shutdown()

if __name__ == "__main__":
    main()
