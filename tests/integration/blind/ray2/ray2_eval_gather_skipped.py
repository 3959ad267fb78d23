"""Ray trainer job: 3 Trainer actors in a gloo group, manual grad averaging,
periodic eval with all_gather_object of metrics. Trainer 2's eval batch at step 6
lacks 'labels'; the exception is swallowed and rank 2 skips all_gather_object.

Written blind on 2026-12-04 by a helper that had read only the README and docs/RAY.md
(helper 86). First verdict partly right: "Collective mismatch: rank 2 issued a different
operation than the other members at all_reduce seq 23 ... (ranks 0-1: all_gather_object;
rank 2: all_reduce ...)" with advice about threads, shapes and group order; and env-diff's
false "rank 2 runs differently from its peers: MASTER_ADDR=(unset)" (its environment record
was written before its setup() set the variables). Now: "... Rank 2 never called
all_gather_object: ranks 0-1 wait in it, while rank 2 issued all_reduce there, the collective
ranks 0-1 issued just before it: it went on past all_gather_object (its previous one on this
group: seq 9, in step with ranks 0-1) ... Next: look for the condition that makes the named
rank(s) take another path (... an exception swallowed on that rank)"; the record is written
again at the join. For the corpus: ray.init with the job's HANGTRACE variables in
runtime_env (the harness's way) and address="local" instead of --runtime-env-json.

EXPECTED verdict: collective-mismatch, culprit rank 2 (Trainer 'trainer-2').
"""
LAUNCH = "ray"
EXPECT = {"kind": "collective-mismatch", "culprit_ranks": [2], "culprit_actors": ["Trainer 'trainer-2'"],
          "cause": "mismatch", "summary_has": "it went on past all_gather_object"}

import argparse, json, os, socket, time
from datetime import timedelta

import ray

WORLD = 3
EVAL_EVERY = 3


def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p


def make_eval_batch(rank, step):
    import torch
    g = torch.Generator().manual_seed(1000 * step + rank)
    batch = {"inputs": torch.randn(16, 8, generator=g),
             "labels": torch.randint(0, 4, (16,), generator=g)}
    # data bug: one shard of the eval set is missing its labels column
    if rank == 2 and step == 6:
        del batch["labels"]
    return batch


@ray.remote(num_cpus=1)
class Trainer:
    def __init__(self, rank, world, addr, port):
        import torch
        torch.set_num_threads(1)
        self.rank, self.world, self.addr, self.port = rank, world, addr, port

    def setup(self):
        import torch, torch.distributed as dist
        os.environ["MASTER_ADDR"] = self.addr
        os.environ["MASTER_PORT"] = str(self.port)
        dist.init_process_group("gloo", rank=self.rank, world_size=self.world,
                                timeout=timedelta(seconds=90))
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(),
                                         torch.nn.Linear(32, 4))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        return self.rank

    def compute_metrics(self, batch):
        import torch
        with torch.no_grad():
            logits = self.model(batch["inputs"])
            labels = batch["labels"]
            loss = torch.nn.functional.cross_entropy(logits, labels).item()
            acc = (logits.argmax(-1) == labels).float().mean().item()
        return {"rank": self.rank, "eval_loss": loss, "eval_acc": acc}

    def train_step(self, step):
        import torch, torch.distributed as dist
        g = torch.Generator().manual_seed(step * 10 + self.rank)
        x = torch.randn(32, 8, generator=g)
        y = torch.randint(0, 4, (32,), generator=g)
        if step % EVAL_EVERY == 0:
            try:
                batch = make_eval_batch(self.rank, step)
                metrics = self.compute_metrics(batch)
                all_metrics = [None] * self.world
                dist.all_gather_object(all_metrics, metrics)
                if self.rank == 0:
                    acc = sum(m["eval_acc"] for m in all_metrics) / self.world
                    print(f"[rank0] step {step} global eval acc {acc:.3f}", flush=True)
            except Exception as e:
                print("eval failed", repr(e), flush=True)
        self.opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(self.model(x), y)
        loss.backward()
        for p in self.model.parameters():
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad /= self.world
        self.opt.step()
        return loss.item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    ray.init(address="local", num_cpus=4, include_dashboard=False,
             runtime_env={"env_vars": {k: v for k, v in os.environ.items() if k.startswith("HANGTRACE")}})
    port = free_port()
    trainers = [Trainer.options(name=f"trainer-{r}").remote(r, WORLD, "127.0.0.1", port)
                for r in range(WORLD)]
    print("setup:", ray.get([t.setup.remote() for t in trainers]), flush=True)
    for step in range(1, args.steps + 1):
        t0 = time.time()
        losses = ray.get([t.train_step.remote(step) for t in trainers])
        print(f"step {step} done loss {sum(losses)/len(losses):.4f} ({time.time()-t0:.2f}s)", flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
