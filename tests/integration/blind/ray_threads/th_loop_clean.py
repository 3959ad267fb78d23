"""th_loop_ends_early with even shards: both loop threads run 20 steps and the driver stops
polling when both report done.

The same job as th_loop_ends_early.py (two gloo Trainer actors whose `start()` runs the loop in
a `threading.Thread(name="trainer-loop")`, a DataLoader with 2 workers per rank, the driver
polling `get_status()` every second like Ray Train's controller), with an even split of the data
(160 samples per rank: 20 batches of 8 each). Both loop threads end after step 19, the driver
sees both done and shuts Ray down. About 10 s of training once the actors are up.

A correct tool: no verdict (no hang, no death, no mismatch; the polls and the ended loop threads
are a clean finish).
"""
import datetime, os, socket, threading, time

import ray

LAUNCH = "ray"
EXPECT = None  # no verdict: the run is clean

BATCH = 8
SHARD_SIZES = [160, 160]   # even split: 20 batches each


@ray.remote(num_cpus=1)
class Trainer:
    def __init__(self, rank, world, addr, port):
        self.rank, self.world = rank, world
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0",
                          MASTER_ADDR=addr, MASTER_PORT=str(port))
        self.step, self.done, self.error, self.loss = 0, False, None, None
        self.thread = None

    def setup(self):
        import torch, torch.distributed as dist
        torch.set_num_threads(1)
        dist.init_process_group("gloo", timeout=datetime.timedelta(hours=1))
        return dist.get_rank()

    def start(self):
        self.thread = threading.Thread(target=self._run, name="trainer-loop", daemon=True)
        self.thread.start()
        return True

    def get_status(self):
        return {"rank": self.rank, "step": self.step, "done": self.done, "error": self.error,
                "loss": self.loss}

    def _run(self):
        try:
            self._train_loop()
        except Exception as e:          # reported to the driver through get_status
            self.error = f"{type(e).__name__}: {e}"
        finally:
            self.done = True

    def _train_loop(self):
        import torch, torch.distributed as dist
        from torch.utils.data import DataLoader, TensorDataset
        g = torch.Generator().manual_seed(7 + self.rank)
        x = torch.randn(SHARD_SIZES[self.rank], 32, generator=g)
        y = x[:, :4].sum(dim=1, keepdim=True)
        loader = DataLoader(TensorDataset(x, y), batch_size=BATCH, num_workers=2)
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
        opt = torch.optim.SGD(model.parameters(), lr=1e-2)
        for step, (xb, yb) in enumerate(loader):
            self.step = step
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= self.world
            opt.step()
            avg = loss.detach().clone()
            dist.all_reduce(avg)
            self.loss = avg.item() / self.world
            print(f"[rank {self.rank}] step {step} loss {self.loss:.4f}", flush=True)
            time.sleep(0.2)
        print(f"[rank {self.rank}] data exhausted after {step + 1} steps", flush=True)


def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p


def main():
    ray.init(address="local", num_cpus=4, include_dashboard=False,
             runtime_env={"env_vars": {k: v for k, v in os.environ.items() if k.startswith("HANGTRACE")}})
    world, port = 2, free_port()
    trainers = [Trainer.options(name=f"trainer-{r}").remote(r, world, "127.0.0.1", port) for r in range(world)]
    print("[driver] ranks", ray.get([t.setup.remote() for t in trainers]), flush=True)
    ray.get([t.start.remote() for t in trainers])
    t0 = time.time()
    while True:                       # the controller: poll every worker every second
        statuses = ray.get([t.get_status.remote() for t in trainers])
        if all(s["done"] for s in statuses):
            break
        time.sleep(1.0)
    print(f"[driver] all workers done in {time.time() - t0:.1f}s: {statuses}", flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
