"""Trainer actors run their loop in a thread; rank 1's shard is shorter, its loop ends 3 steps
early while rank 0 still all-reduces.

Incident (the controller pattern of Ray Train, written by hand): the driver starts two Trainer
actors (ranks 0-1, one gloo process group). `start()` launches the training loop in a
`threading.Thread(name="trainer-loop")` and returns at once; the driver then calls
`get_status()` on each actor every second until both report done. Each rank reads its own data
shard through a DataLoader with 2 workers; the shards come from an uneven split of the files
(160 samples on rank 0, 136 on rank 1: 20 vs 17 batches of 8). Every step all-reduces the
gradients and the loss. Rank 1's loop thread runs out of batches after step 16, marks itself
done and ends; rank 0 enters step 17's all_reduce and waits for ever. The actors' main threads
idle in Ray's task loop between the driver's `get_status()` polls (a heartbeat, not progress);
the driver polls for ever (rank 0 never reports done).

A correct tool: rank 1 skipped the collective - its loop thread 'trainer-loop' ended after its
last all_reduce while rank 0 waits in the next one; not "rank 1 stuck outside collectives in
Ray's task loop" and not rank 0.
"""
import datetime, os, socket, threading, time

import ray

LAUNCH = "ray"
EXPECT = {"kind": "skipped-collective", "kind_also_right": ["collective-mismatch"], "summary_has": "trainer-loop",
          "culprit_ranks": [1], "culprit_actors": ["Trainer 'trainer-1'"], "cause": "skipped"}

BATCH = 8
SHARD_SIZES = [160, 136]   # uneven split: rank 1 has 3 batches fewer


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
