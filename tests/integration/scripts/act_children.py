"""Parent that starts children by subprocess, multiprocessing spawn and fork.

Prints one line per child: ``<how> <pid> <exitcode>``. With ``--torch``, also forks a
child that initialises a world-size-1 gloo group and runs one all_reduce (torch is
imported in the parent first, so the child inherits the parent's wrappers).
"""

import multiprocessing as mp
import os
import subprocess
import sys


def child_phase(tag, q):
    from hangtrace import tracer

    with tracer.phase("child-" + tag):
        tracer.step(11)
    q.put((tag, os.getpid(), tracer.enabled()))


def child_torch(port, q):
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=0, world_size=1)
    dist.all_reduce(torch.ones(3))
    dist.destroy_process_group()
    q.put(("fork-torch", os.getpid(), True))


if __name__ == "__main__":
    from hangtrace import tracer

    with tracer.phase("parent"):
        pass
    print("parent", os.getpid(), 0, flush=True)
    p = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    print("subprocess", p.stdout.strip(), p.returncode, flush=True)
    for method in ("spawn", "fork"):
        ctx = mp.get_context(method)
        q = ctx.Queue()
        pr = ctx.Process(target=child_phase, args=(method, q))
        pr.start()
        tag, pid, enabled = q.get(timeout=60)
        pr.join(60)
        print(method, pid, pr.exitcode, enabled, flush=True)
    if "--torch" in sys.argv:
        import torch.distributed  # noqa: F401  (hooked in the parent, inherited by the fork)

        port = int(sys.argv[sys.argv.index("--torch") + 1])
        ctx = mp.get_context("fork")
        q = ctx.Queue()
        pr = ctx.Process(target=child_torch, args=(port, q))
        pr.start()
        tag, pid, _ = q.get(timeout=60)
        pr.join(60)
        print("fork-torch", pid, pr.exitcode, flush=True)
