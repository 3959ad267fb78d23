"""4-rank gloo job: rank 3 builds its data-parallel groups before its tensor-parallel ones (a config branch).

Incident (blind helper 101, 2026-12-04, run by a user as `DP_FIRST_RANKS=3 hangtrace run --stall-s
15 --stop-on-stall -- torchrun --standalone --nproc-per-node 4 job.py`): after init_process_group
every rank creates TP groups [0,1], [2,3] and DP groups [0,2], [1,3] with dist.new_group; rank 3's
per-node config says dp_first=True, so it creates them in another order. torch names groups by a
counter: group '4' is [2,3] on rank 3 and [1,3] on rank 1. In the first step rank 3's TP
all_reduce (4 floats) meets rank 1's DP all_reduce (9 floats): gloo aborts rank 3 ("Received data
size doesn't match expected size") and torchrun stops the rest. A good tool: rank 3 created its
groups in another order. The first verdict named "rank 3 issued all_reduce with a different size"
(and rank 1, with the sizes the other way round; "Progressing" with equal sizes and wrong sums).

Corpus changes to the job as written (what the harness needs, nothing else): DP_FIRST_RANKS
defaults to "3" (the user set it on the command line).
"""
import os
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

LAUNCH = "torchrun"
NPROC = 4
EXPECT = {"kind": "collective-mismatch", "culprit_ranks": [3], "cause": "mismatch",
          "says": ["rank 3 created its process groups in another order than ranks 0-2"]}


class Toy(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(8, generator=g)
        return x, x.sum(dim=0, keepdim=True)


def load_config(rank):
    # per-node config: node holding rank 3 has a stale config saying dp_first=True
    cfg = {"dp_first": False}
    if str(rank) in os.environ.get("DP_FIRST_RANKS", "3").split(","):
        cfg["dp_first"] = True
    return cfg


def build_groups(rank, cfg):
    tp_specs = [[0, 1], [2, 3]]
    dp_specs = [[0, 2], [1, 3]]
    order = [("dp", dp_specs), ("tp", tp_specs)] if cfg["dp_first"] else [("tp", tp_specs), ("dp", dp_specs)]
    groups = {}
    for kind, specs in order:
        for ranks in specs:
            g = dist.new_group(ranks)
            if rank in ranks:
                groups[kind] = (g, ranks)
    return groups


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    cfg = load_config(rank)
    print(f"rank {rank}: cfg={cfg}", flush=True)
    groups = build_groups(rank, cfg)
    tp_group, tp_ranks = groups["tp"]
    dp_group, dp_ranks = groups["dp"]
    print(f"rank {rank}: groups built tp={tp_ranks} dp={dp_ranks}", flush=True)

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Toy(), batch_size=8, num_workers=2)
    for step, (x, y) in enumerate(loader):
        if step >= 4:
            break
        out = model(x)
        # "tensor parallel" reduction of a partial activation statistic
        tp_stat = torch.full((int(os.environ.get("TP_NUMEL", "9" if os.environ.get("SAME_SIZE") else "4")),), float(rank))
        dist.all_reduce(tp_stat, group=tp_group)
        expected_tp = float(sum(tp_ranks))
        loss = ((out - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        flat = torch.cat([p.grad.flatten() for p in model.parameters()])
        dist.all_reduce(flat, group=dp_group)
        rid = torch.tensor([float(rank)])
        if not os.environ.get("SAME_SIZE"):
            dist.all_reduce(rid, group=dp_group)
        expected_dp = float(sum(dp_ranks))
        print(f"rank {rank} step {step}: tp_stat={tp_stat[0].item()} (expect {expected_tp}) "
              f"dp_rank_sum={rid.item()} (expect {expected_dp}) loss={loss.item():.4f}", flush=True)
        opt.step()
    dist.barrier()
    print(f"rank {rank}: done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
