"""What the phase/step API and the collective wrapper cost inside a real training step (issue 13).

In a tight loop ``tracer.step(n)`` plus ``with tracer.phase("train")`` cost about 17 us
here; inside a DDP step, between kernels that evict the caches, they cost several times
that. This benchmark measures them where they run: one traced process, a world-size-1
gloo group, a DDP MLP (256-1024-1024-10, batch 32, one thread), and blocks of 20 steps in
four modes, alternating in one process:

- ``none``: no API call, ``all_reduce`` of the loss through ``__wrapped__`` (untraced call);
- ``api``: ``tracer.step`` + ``tracer.phase`` (three memory samples: step, phase entry, exit);
- ``wrap``: the loss ``all_reduce`` through hangtrace's wrapper;
- ``both``.

"added" is the median over block pairs of (mode - ``none``) of the calling thread's CPU
time per step (``time.thread_time_ns``: gloo's own threads excluded). ``--baseline TREE``
runs the same in another source tree, side by side, alternating trees.

    taskset -c 0 python3 benchmarks/bench_api_insitu.py --repeats 2 --baseline TREE
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.abspath(__file__)
REPO = os.path.dirname(os.path.dirname(HERE))
MODES = {"none": (False, False), "api": (True, False), "wrap": (False, True), "both": (True, True)}


def child(blocks: int, per_block: int) -> dict:
    """One traced process: {mode: [us per step per block]}."""
    import contextlib
    import socket
    import time

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from hangtrace import tracer

    torch.set_num_threads(1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=0, world_size=1)
    torch.manual_seed(0)
    nn = torch.nn
    m = DDP(
        nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
    )
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    x, y = torch.randn(32, 256), torch.randint(0, 10, (32,))
    raw = getattr(dist.all_reduce, "__wrapped__", dist.all_reduce)

    def step(n: int, api: bool, wrap: bool) -> None:
        if api:
            tracer.step(n)
        with tracer.phase("train") if api else contextlib.nullcontext():
            loss = nn.functional.cross_entropy(m(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            (dist.all_reduce if wrap else raw)(loss.detach())

    res: dict = {k: [] for k in MODES}
    n = 0
    for _ in range(30):  # warm-up
        n += 1
        step(n, True, True)
    for blk in range(blocks):
        order = list(MODES.items())
        for k, (api, wrap) in order if blk % 2 else order[::-1]:
            c = time.thread_time_ns()
            for _ in range(per_block):
                n += 1
                step(n, api, wrap)
            res[k].append((time.thread_time_ns() - c) / per_block / 1e3)
    dist.destroy_process_group()
    return res


def run_tree(tree: str, blocks: int, per_block: int) -> dict:
    import shutil
    import tempfile

    run_dir = tempfile.mkdtemp(prefix="ht-bench-api-")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HANGTRACE")}
    env.update(
        HANGTRACE="1",
        HANGTRACE_AUTO_WATCH="0",
        TORCH_FR_BUFFER_SIZE="0",
        OMP_NUM_THREADS="1",
        PYTHONPATH=tree,
        HANGTRACE_DIR=run_dir,
    )
    try:
        out = subprocess.run(
            [sys.executable, HERE, "--child", "--blocks", str(blocks), "--per-block", str(per_block)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    return json.loads([ln for ln in out.splitlines() if ln.startswith("{")][-1])


def main(argv: list | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--blocks", type=int, default=24)
    ap.add_argument("--per-block", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=2, help="processes per tree")
    ap.add_argument("--baseline", help="another source tree, run alternately")
    ap.add_argument("--out", help="write the per-block figures as JSON")
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.blocks, a.per_block)), flush=True)
        return 0
    trees = {"this tree": REPO}
    if a.baseline:
        trees["baseline"] = os.path.abspath(a.baseline)
    got: dict = {n: [] for n in trees}
    for _ in range(a.repeats):
        for n, t in trees.items():
            got[n].append(run_tree(t, a.blocks, a.per_block))
    print("| tree | run | step, no API (us) | + step/phase API (us) | + wrapper (us) | + both (us) |")
    print("|---|---|---:|---:|---:|---:|")
    for n, runs in got.items():
        for i, r in enumerate(runs):
            add = {k: statistics.median(a_ - b_ for a_, b_ in zip(r[k], r["none"])) for k in MODES}
            print(
                "| %s | %d | %.0f | %+.1f | %+.1f | %+.1f |"
                % (n, i + 1, statistics.median(r["none"]), add["api"], add["wrap"], add["both"])
            )
    if a.out:
        with open(a.out, "w") as f:
            json.dump(got, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
