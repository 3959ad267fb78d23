"""rz_user_barrier_extra without the bug: both trainers all-reduce the metric at step 8.

The same job as rz_user_barrier_extra.py (a user-written async Coordinator actor whose
`arrive(rank, step)` is a per-step barrier, two gloo Trainer actors with a DataLoader of 2
workers and a 'log-flusher' helper thread, gradients and loss all-reduced every step), with the
logging fix: the grad-norm metric at step 8 is all-reduced on every rank and printed on rank 0.
The job runs 20 steps and ends on its own (about 10 s after the actors are up).

A correct tool: no verdict (no hang, no death, no mismatch).
"""
import asyncio, datetime, os, socket, threading, time

import ray

LAUNCH = "ray"
EXPECT = None  # no verdict: the run is clean

STEPS = 20
LOG_EVERY = 8       # the metric is all-reduced at this step
BUGGY = False       # fixed: every rank all-reduces the metric


@ray.remote(num_cpus=0)
class Coordinator:
    """A per-step rendezvous: arrive() returns once every rank arrived for that step."""
    def __init__(self, world):
        self.world = world
        self.arrived = {}
        self.events = {}

    async def arrive(self, rank, step):
        ev = self.events.setdefault(step, asyncio.Event())
        self.arrived.setdefault(step, set()).add(rank)
        if len(self.arrived[step]) == self.world:
            ev.set()
        await ev.wait()
        return step


@ray.remote(num_cpus=1)
class Trainer:
    def __init__(self, rank, world, addr, port):
        self.rank, self.world = rank, world
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0",
                          MASTER_ADDR=addr, MASTER_PORT=str(port))
        self.last_loss = None

    def setup(self):
        import torch, torch.distributed as dist
        from torch.utils.data import DataLoader, TensorDataset
        torch.set_num_threads(1)
        dist.init_process_group("gloo", timeout=datetime.timedelta(hours=1))
        g = torch.Generator().manual_seed(100 + self.rank)
        x = torch.randn(STEPS * 16, 32, generator=g)
        y = x[:, :4].sum(dim=1, keepdim=True)
        self.loader = DataLoader(TensorDataset(x, y), batch_size=16, num_workers=2)
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-2)
        threading.Thread(target=self._flush_logs, name="log-flusher", daemon=True).start()
        return dist.get_rank()

    def _flush_logs(self):
        while True:
            time.sleep(1.0)
            if self.last_loss is not None:
                print(f"[rank {self.rank}] last loss {self.last_loss:.4f}", flush=True)

    def train(self, coord):
        import torch, torch.distributed as dist
        for step, (x, y) in enumerate(self.loader):
            ray.get(coord.arrive.remote(self.rank, step))        # everyone starts the step together
            loss = torch.nn.functional.mse_loss(self.model(x), y)
            self.opt.zero_grad()
            loss.backward()
            for p in self.model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= self.world
            self.opt.step()
            avg = loss.detach().clone()
            dist.all_reduce(avg)
            self.last_loss = avg.item() / self.world
            if step == LOG_EVERY and (self.rank == 0 or not BUGGY):
                gnorm = torch.stack([p.grad.norm() for p in self.model.parameters()]).norm()
                dist.all_reduce(gnorm)                           # every rank (the fix)
                if self.rank == 0:
                    print(f"[rank 0] step {step} grad-norm {gnorm.item() / self.world:.4f}", flush=True)
            print(f"[rank {self.rank}] step {step} loss {self.last_loss:.4f}", flush=True)
            time.sleep(0.05)
        return {"rank": self.rank, "steps": step + 1, "loss": self.last_loss}


def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p


def main():
    ray.init(address="local", num_cpus=4, include_dashboard=False,
             runtime_env={"env_vars": {k: v for k, v in os.environ.items() if k.startswith("HANGTRACE")}})
    world, port = 2, free_port()
    coord = Coordinator.options(name="coordinator").remote(world)
    trainers = [Trainer.options(name=f"trainer-{r}").remote(r, world, "127.0.0.1", port) for r in range(world)]
    print("[driver] ranks", ray.get([t.setup.remote() for t in trainers]), flush=True)
    t0 = time.time()
    results = ray.get([t.train.remote(coord) for t in trainers])   # a hang blocks here until stopped
    print(f"[driver] done in {time.time() - t0:.1f}s: {results}", flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
