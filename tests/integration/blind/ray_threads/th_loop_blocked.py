"""Trainer actors run their loop in a thread; rank 1's loop thread blocks for ever on a prefetch
queue nobody fills, at step 6.

Incident (a hand-written Ray controller, like th_loop_ends_early): two Trainer actors (ranks
0-1, one gloo process group); `start()` launches the loop in a
`threading.Thread(name="trainer-loop")` and returns; the driver polls `get_status()` every
second. From step 6 on (after warm-up) the loop takes its batches from a background prefetcher
(`self.prefetch_q.get()`) instead of the DataLoader (2 workers) directly. The prefetcher thread
is started only when `config["prefetch"]` is true, and rank 1's config (its own yaml override)
says false: its prefetch queue is created but nobody ever fills it. Rank 1's loop thread blocks
for ever in `queue.Queue.get()` at step 6, before its all_reduce; rank 0 (its prefetcher runs)
waits for ever in step 6's all_reduce. The driver keeps polling (no rank ever reports done).

A correct tool: stuck-outside-collective naming rank 1, blocked in the loop thread
'trainer-loop' at the `self.prefetch_q.get()` line; rank 0 in all_reduce is cascade.
"""
import datetime, os, queue, socket, threading, time

import ray

LAUNCH = "ray"
EXPECT = {"kind": "stuck-outside-collective", "culprit_ranks": [1],
          "culprit_actors": ["Trainer 'trainer-1'"], "cause": "blocked",
          "line": "xb, yb = self.prefetch_q.get()", "summary_has": "(th_loop_blocked.py:85)"}

BATCH = 8
SHARD = 160                 # 20 batches of 8 per rank
WARMUP_STEPS = 6            # from this step on, batches come from the prefetch queue
CONFIGS = [{"prefetch": True}, {"prefetch": False}]   # rank 1's override switched it off


@ray.remote(num_cpus=1)
class Trainer:
    def __init__(self, rank, world, addr, port):
        self.rank, self.world = rank, world
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0",
                          MASTER_ADDR=addr, MASTER_PORT=str(port))
        self.config = CONFIGS[rank]
        self.step, self.done, self.error, self.loss = 0, False, None, None
        self.prefetch_q = queue.Queue(maxsize=4)

    def setup(self):
        import torch, torch.distributed as dist
        torch.set_num_threads(1)
        dist.init_process_group("gloo", timeout=datetime.timedelta(hours=1))
        return dist.get_rank()

    def start(self):
        threading.Thread(target=self._run, name="trainer-loop", daemon=True).start()
        return True

    def get_status(self):
        return {"rank": self.rank, "step": self.step, "done": self.done, "error": self.error,
                "loss": self.loss}

    def _run(self):
        try:
            self._train_loop()
        except Exception as e:
            self.error = f"{type(e).__name__}: {e}"
        finally:
            self.done = True

    def _prefetch(self, it):
        for batch in it:
            self.prefetch_q.put(batch)

    def _train_loop(self):
        import torch, torch.distributed as dist
        from torch.utils.data import DataLoader, TensorDataset
        g = torch.Generator().manual_seed(7 + self.rank)
        x = torch.randn(SHARD, 32, generator=g)
        y = x[:, :4].sum(dim=1, keepdim=True)
        it = iter(DataLoader(TensorDataset(x, y), batch_size=BATCH, num_workers=2))
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
        opt = torch.optim.SGD(model.parameters(), lr=1e-2)
        for step in range(SHARD // BATCH):
            self.step = step
            if step < WARMUP_STEPS:
                xb, yb = next(it)
            else:
                if step == WARMUP_STEPS and self.config["prefetch"]:
                    threading.Thread(target=self._prefetch, args=(it,), name="prefetcher", daemon=True).start()
                xb, yb = self.prefetch_q.get()
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
