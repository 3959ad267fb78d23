"""Incident (verl #6365 style): after the model is wrapped, the order of its buffers
differs across ranks, and the "sync model states from rank 0" loop broadcasts parameters
and then buffers in that LOCAL order. Rank 0 broadcasts buffers [inv_freq (32 elems),
pos_table (2048 elems)]; rank 1's wrapper collected them through a size-keyed dict and
posts [pos_table, inv_freq]. Broadcast #k (the first buffer broadcast) therefore has 32
elements on rank 0 and 2048 on rank 1. On gloo this is a size-mismatch abort or a hang.
Both ranks take part in the bug (neither alone is "the" wrong one: the order differs).

Expected verdict: collective-mismatch at that broadcast, naming both sizes (32 vs 2048);
culprit ranks [0, 1] (a tool may legitimately name the rank gloo aborted first if it
crashes, but the evidence should show the two sizes). torchrun, 2 ranks, gloo.
"""
LAUNCH = "torchrun"
NPROC = 2
EXPECT = {"kind": "collective-mismatch", "culprit_ranks": [0, 1], "cause": None}

import datetime

import torch
import torch.distributed as dist


class Policy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Linear(16, 32)
        self.head = torch.nn.Linear(32, 4)
        self.register_buffer("inv_freq", torch.arange(32, dtype=torch.float32))
        self.register_buffer("pos_table", torch.zeros(2048))


def wrapped_buffers(model, rank):
    bufs = list(model.named_buffers())
    if rank != 0:
        # the wrapper on this rank rebuilt the buffer list from a dict keyed by numel
        # (largest first) -> a different order than on rank 0
        bufs = sorted(bufs, key=lambda kv: -kv[1].numel())
    return bufs


def sync_module_states(model, rank):
    for name, p in model.named_parameters():
        dist.broadcast(p.data, src=0)
    for name, b in wrapped_buffers(model, rank):
        print(f"rank {rank}: broadcast buffer {name} numel={b.numel()}", flush=True)
        dist.broadcast(b, src=0)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = Policy()
    sync_module_states(model, rank)
    print(f"rank {rank}: model states synced", flush=True)
    x = torch.randn(4, 16)
    out = model.head(model.emb(x)).sum()
    dist.all_reduce(out)
    dist.barrier()
    print(f"rank {rank}: done {out.item():.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
