"""3-rank gloo training job launched with plain multiprocessing; rank 0's eval subprocess deadlocks on its pipe.

Incident (blind helper 100, 2026-12-04, run by a user as `hangtrace run --stall-s 15
--stop-on-stall -- python train_job.py`): the launcher sets RANK/WORLD_SIZE/MASTER_* and starts
three multiprocessing.Process ranks (gloo, DataLoader(num_workers=1), an all_reduce per gradient).
Every 10 steps rank 0 runs eval_tool.py with Popen(stdout=PIPE, stderr=PIPE), then p.wait(), and
only then reads the pipes: the classic deadlock of the subprocess docs. At step 10 the tool prints
76 bytes (it works); at step 20 about 1 MB: it blocks writing the full pipe, rank 0 blocks in
wait(), ranks 1-2 wait in the barrier after the eval. The verdict was right the first time (rank
0, Popen.wait at run_eval, the child's write to a full pipe at its print line, "use
communicate()"); its advice then told the user to fix the child: now the rank's
(CHILD_PIPE_NEXT).

Corpus changes to the job as written (what the harness needs, nothing else): eval_tool.py lives
in servers/ beside the other jobs' companion programs.
"""
import multiprocessing
import os
import socket
import subprocess
import sys
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

LAUNCH = "mp"
NPROC = 3
EXPECT = {"kind": "stuck-outside-collective", "culprit_ranks": [0], "cause": "blocked",
          "says": ["never reads the child's pipes", "the rank, not its child, must change"]}

HERE = os.path.dirname(os.path.abspath(__file__))
WORLD = 3
STEPS = 40


def run_eval(step):
    args = [sys.executable, os.path.join(HERE, "servers", "eval_tool.py"), "--step", str(step)]
    if step >= 20:
        # per-sample metrics: several hundred KB on stdout
        args += ["--samples", "5000", "--per-sample"]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    rc = p.wait()                     # BUG: waits before draining the pipe
    out = p.stdout.read()
    err = p.stderr.read()
    last = out.decode().strip().splitlines()[-1] if out else ""
    print(f"[rank 0] eval step {step} rc={rc} bytes={len(out)} {last}", flush=True)
    if err:
        print(err.decode(), file=sys.stderr, flush=True)


def main():
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    torch.manual_seed(rank)
    x = torch.randn(512, 16)
    y = x.sum(dim=1, keepdim=True)
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True,
                        num_workers=1, persistent_workers=True)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    it = iter(loader)
    for step in range(1, STEPS + 1):
        try:
            xb, yb = next(it)
        except StopIteration:
            it = iter(loader)
            xb, yb = next(it)
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        opt.step()
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
        time.sleep(0.05)
        if step % 10 == 0:
            if rank == 0:
                run_eval(step)
            dist.barrier()
    dist.destroy_process_group()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


if __name__ == "__main__":
    port = free_port()
    procs = []
    for r in range(WORLD):
        os.environ.update(RANK=str(r), WORLD_SIZE=str(WORLD),
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        p = multiprocessing.Process(target=main)
        p.start()
        procs.append(p)
    for p in procs:
        p.join()
    print("exit codes", [p.exitcode for p in procs])
    sys.exit(max(abs(p.exitcode or 0) for p in procs))
