"""Four pipeline stages, one per rank, started with plain multiprocessing (the parent sets RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT in each child's environment). Forward with
``batch_isend_irecv``, backward with ``irecv`` + ``req.wait()``; after a refactor for
interleaved schedules stage 2 posts its gradient receive from rank 1 instead of rank 3: rank 2
and rank 1 each wait to receive from the other, rank 3's sends to rank 2 stay in flight while
it waits in the loss all_reduce, rank 0 waits to receive from rank 1.

Written blind on 2026-12-04 by a helper that had read only the README (helper 63). Its verdict
named ranks 0-2 "not in any collective ... blocked in futex" (fixed: a rank waiting in
``Work.wait()`` on its async op is blocked in it, analyze/workwait.py; the p2p tie broken by
rank 3's unmatched sends, rules/mismatch.py).
"""
LAUNCH = "python"
NPROC = 4
EXPECT = {"kind": "collective-mismatch", "culprit_ranks": [2],
          "says": ["Collective mismatch (p2p): rank 2 and its peer rank 1 both posted irecv",
                   "Rank 3 sends to rank 2", "most likely the wrong peer"]}

import os
import socket
import sys
import time
import multiprocessing as mp

import torch
import torch.distributed as dist
import torch.nn as nn

WORLD_SIZE = 4
HIDDEN = 32
MICRO_BATCH = 8
NUM_MICROBATCHES = 4
STEPS = 5
NUM_CHUNKS = 1  # virtual stages per rank (interleaved schedule); 1 = plain GPipe


def log(rank, msg):
    print(f"[{time.strftime('%H:%M:%S')}] [stage {rank}] {msg}", flush=True)


class StageComm:
    """Who a stage talks to, per direction."""

    def __init__(self, rank, world, num_chunks=1):
        self.rank = rank
        self.world = world
        self.num_virtual = world * num_chunks
        vstage = rank  # chunk 0 only for now
        self.is_first = vstage == 0
        self.is_last = vstage == self.num_virtual - 1
        self.prev_rank = (rank - 1) % world
        self.next_rank = (rank + 1) % world
        # forward: activations come from prev, go to next
        self.fwd_recv_peer = self.prev_rank
        self.fwd_send_peer = self.next_rank
        # backward: grads come from next, go to prev.  With interleaving, the
        # last rank's chunk wraps around to rank 0 of the next chunk, so the
        # stage before the wrap receives from its prev rank instead.
        if vstage + 1 < world - 1:
            self.bwd_recv_peer = self.next_rank
        else:
            self.bwd_recv_peer = self.prev_rank
        self.bwd_send_peer = self.prev_rank


def build_stage(rank):
    torch.manual_seed(1234 + rank)
    if rank == WORLD_SIZE - 1:
        return nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 1))
    return nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN))


def train_step(step, rank, comm, model, opt, data, targets):
    inputs, outputs = [], []
    losses = []
    pending_sends = []

    # ---------------- forward ----------------
    for mb in range(NUM_MICROBATCHES):
        if comm.is_first:
            x = data[mb]
        else:
            x = torch.empty(MICRO_BATCH, HIDDEN)
            ops = [dist.P2POp(dist.irecv, x, comm.fwd_recv_peer)]
            for req in dist.batch_isend_irecv(ops):
                req.wait()
            x.requires_grad_(True)
        y = model(x)
        inputs.append(x)
        outputs.append(y)
        if comm.is_last:
            loss = nn.functional.mse_loss(y, targets[mb]) / NUM_MICROBATCHES
            losses.append(loss)
        else:
            ops = [dist.P2POp(dist.isend, y.detach().contiguous(), comm.fwd_send_peer)]
            pending_sends.extend(dist.batch_isend_irecv(ops))
    for req in pending_sends:
        req.wait()
    pending_sends.clear()
    log(rank, f"step {step}: forward done ({NUM_MICROBATCHES} microbatches)")

    # ---------------- backward ----------------
    for mb in range(NUM_MICROBATCHES):
        if comm.is_last:
            losses[mb].backward()
        else:
            grad = torch.empty(MICRO_BATCH, HIDDEN)
            req = dist.irecv(grad, src=comm.bwd_recv_peer)
            req.wait()
            outputs[mb].backward(grad)
        if not comm.is_first:
            g = inputs[mb].grad.contiguous()
            pending_sends.append(dist.isend(g, dst=comm.bwd_send_peer))
    log(rank, f"step {step}: backward done")

    opt.step()
    opt.zero_grad(set_to_none=True)

    # ---------------- logging ----------------
    local_loss = torch.tensor([sum(l.item() for l in losses)], dtype=torch.float32)
    dist.all_reduce(local_loss)  # only the last stage contributes a non-zero
    for req in pending_sends:
        req.wait()
    return local_loss.item()


def worker():
    dist.init_process_group(backend="gloo")  # env:// rendezvous
    rank = dist.get_rank()
    world = dist.get_world_size()
    comm = StageComm(rank, world, NUM_CHUNKS)
    log(rank, f"up, pid {os.getpid()}, fwd {comm.fwd_recv_peer}->{comm.fwd_send_peer}, "
              f"bwd recv from {comm.bwd_recv_peer} send to {comm.bwd_send_peer}")
    model = build_stage(rank)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    g = torch.Generator().manual_seed(0)
    for step in range(STEPS):
        data = [torch.randn(MICRO_BATCH, HIDDEN, generator=g) for _ in range(NUM_MICROBATCHES)]
        targets = [torch.randn(MICRO_BATCH, 1, generator=g) for _ in range(NUM_MICROBATCHES)]
        t0 = time.time()
        loss = train_step(step, rank, comm, model, opt, data, targets)
        if rank == 0:
            log(rank, f"step {step} loss {loss:.4f} ({time.time() - t0:.2f}s)")
    dist.barrier()
    log(rank, "done")
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    port = free_port()
    procs = []
    for rank in range(WORLD_SIZE):
        os.environ["RANK"] = str(rank)
        os.environ["WORLD_SIZE"] = str(WORLD_SIZE)
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        p = mp.Process(target=worker, name=f"stage{rank}")
        p.start()
        procs.append(p)
    print(f"launcher: started {WORLD_SIZE} stages, port {port}", flush=True)
    code = 0
    for p in procs:
        p.join()
        if p.exitcode != 0:
            print(f"launcher: {p.name} exited with {p.exitcode}", flush=True)
            code = 1
    sys.exit(code)


if __name__ == "__main__":
    main()
