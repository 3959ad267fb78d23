"""Two Ray trainer actors meet at a user-written coordinator actor every step; rank 0 alone
all-reduces a metric at step 8.

Incident (a rank-0-only logging bug in a hand-rolled Ray trainer): the driver starts a
Coordinator, an async actor whose `arrive(rank, step)` returns only when every rank has arrived
for that step (a barrier the user wrote instead of `dist.barrier`), and two Trainer actors
(ranks 0-1) in one gloo process group. Each step a trainer calls
`ray.get(coord.arrive.remote(rank, step))`, runs its batch (a DataLoader with 2 workers),
all-reduces its gradients and its loss. At step 8 rank 0 also all-reduces a grad-norm metric
"for the dashboard" (`if self.rank == 0 and step == LOG_EVERY: dist.all_reduce(gnorm)`), a call
rank 1 never makes. Rank 0 then waits for ever in that all_reduce; rank 1 finished step 8 and
waits in `ray.get` on the coordinator's `arrive(1, 9)`, which never returns because rank 0 never
arrives. The driver waits in `ray.get` on both `train()` calls. A 'log-flusher' helper thread in
each trainer prints the last loss every second.

A correct tool: rank 0 is the culprit (its extra collective, the metric all_reduce at
`train`'s LOG_EVERY branch); rank 1, waiting at the coordinator, is cascade - not "rank 1 stuck
outside collectives".
"""
import asyncio, datetime, os, socket, threading, time

import ray

LAUNCH = "ray"
EXPECT = {"kind": "skipped-collective", "kind_also_right": ["collective-mismatch"], "cause": "extra-collective",
          "culprit_ranks": [0], "culprit_actors": ["Trainer 'trainer-0'"],
          "line": "dist.all_reduce(gnorm)", "summary_has": "(rz_user_barrier_extra.py:96)"}

STEPS = 20
LOG_EVERY = 8       # the metric is all-reduced at this step
BUGGY = True        # rank 0 alone all-reduces the metric


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
            if BUGGY and self.rank == 0 and step == LOG_EVERY:
                gnorm = torch.stack([p.grad.norm() for p in self.model.parameters()]).norm()
                dist.all_reduce(gnorm)                           # the bug: rank 0 only
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
