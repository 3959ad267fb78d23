"""A small gloo training job with switchable, deterministic faults (CPU only).

Each fault is modelled on a real kind of incident in distributed (RL) training and
produces a known hang, crash or slow run, so hangtrace can be shown (and tested) naming
the rank that broke the job. See ``examples/README.md`` for what each fault models and
what hangtrace should say.

One command starts the whole job::

    python examples/train_faults.py --fault none|rank0-checkpoint|cp-extra-microbatch|
        decode-loop|mismatch|stuck-queue|kill-rank|slow
        [--world-size N] [--steps K] [--timeout-s T] [--step-sleep-s S] [--fault-step F]

The launcher (this file without ``--worker``) picks a free port, starts one child per
rank (``python train_faults.py --worker ...`` with ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` in the child's
environment, so tools can read ranks from ``/proc/PID/environ``), waits for all of them
and exits with the first non-zero child exit code by time (a child killed by signal N
counts as 128+N), or 0. Children die with the launcher (``PR_SET_PDEATHSIG``).

Under torchrun (``RANK`` and ``WORLD_SIZE`` already set, no ``--launch``) the process
acts as a worker directly.

A hang fault hangs "forever": collectives time out only after ``--timeout-s`` (600 s).
"""

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time

try:
    from hangtrace import tracer
except ImportError:  # the example also runs without hangtrace ("attach" on an uninstrumented job)

    class _NoPhase:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def __call__(self, fn):
            return fn

    class _NoTracer:
        _p = _NoPhase()

        def phase(self, name, step=None):
            return self._p

        def step(self, n):
            pass

        def heartbeat(self):
            pass

        def enabled(self):
            return False

    tracer = _NoTracer()


FAULTS = (
    "none",
    "rank0-checkpoint",
    "cp-extra-microbatch",
    "decode-loop",
    "mismatch",
    "stuck-queue",
    "kill-rank",
    "slow",
    "raise",
    "cuda-oom",
)
LAUNCHERS = ("subprocess", "spawn", "mp")
DEFAULT_WORLD = {"cp-extra-microbatch": 4}
EVAL_EVERY = 2  # eval on steps 2, 4, 6, ...
CKPT_EVERY = 3  # checkpoint on steps 3, 6, ...
BATCH = 4  # samples generated per rank per step
DECODE_ITERS = 3  # decode-loop iterations (every rank, unless fault decode-loop)
MICRO_TOKENS = 64  # token budget of one micro-batch
HIDDEN = 16


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fault", choices=FAULTS, default="none")
    p.add_argument(
        "--world-size", type=int, default=None, help="ranks to start (default 2; 4 for cp-extra-microbatch)"
    )
    p.add_argument("--steps", type=int, default=6, help="training steps (default 6)")
    p.add_argument(
        "--timeout-s", type=float, default=600.0, help="gloo collective timeout in seconds (default 600)"
    )
    p.add_argument(
        "--step-sleep-s",
        type=float,
        default=None,
        help="simulated compute per step, spread over the micro-batches "
        "(default 1.5 for --fault slow, else 0)",
    )
    p.add_argument(
        "--fault-step",
        type=int,
        default=2,
        help="step at which the fault fires (default 2; rank0-checkpoint fires at "
        "the first checkpoint step >= it)",
    )
    p.add_argument(
        "--cp-size",
        type=int,
        default=None,
        help="context-parallel group size (default 2 if world size is even, else 1)",
    )
    p.add_argument(
        "--launcher",
        choices=LAUNCHERS,
        default="subprocess",
        help="how the ranks are started: 'subprocess' (default: one python child per "
        "rank, RANK etc. in the child's environment), 'spawn' "
        "(torch.multiprocessing.spawn) or 'mp' (multiprocessing.Process, spawn "
        "context); both set RANK/WORLD_SIZE/MASTER_* in the parent's own "
        "os.environ before starting each child, as many real jobs do",
    )
    p.add_argument(
        "--loader-workers",
        type=int,
        default=0,
        help="DataLoader(num_workers=N, persistent_workers=True) feeding the training "
        "micro-batches (default 0: inputs made in the rank itself)",
    )
    p.add_argument(
        "--launch", action="store_true", help="start the ranks even if RANK/WORLD_SIZE are already set"
    )
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--parent-pid", type=int, default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.step_sleep_s is None:
        a.step_sleep_s = 1.5 if a.fault == "slow" else 0.0
    return a


# ----------------------------------------------------------------------------- launcher


def _free_port():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
    finally:
        s.close()


def _worker_argv(a):
    argv = [
        sys.executable,
        os.path.abspath(__file__),
        "--worker",
        "--parent-pid",
        str(os.getpid()),
        "--fault",
        a.fault,
        "--steps",
        str(a.steps),
        "--timeout-s",
        str(a.timeout_s),
        "--step-sleep-s",
        str(a.step_sleep_s),
        "--fault-step",
        str(a.fault_step),
    ]
    if a.cp_size is not None:
        argv += ["--cp-size", str(a.cp_size)]
    if a.loader_workers:
        argv += ["--loader-workers", str(a.loader_workers)]
    return argv


def _in_process_rank(rank, a, world, port):
    """Target of the 'spawn' and 'mp' launchers (module level: picklable)."""
    _die_with_parent(os.getppid())
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank))
    Job(a).run()


def launch_in_process(a):
    """'spawn' / 'mp': the parent sets RANK, WORLD_SIZE, MASTER_* in its OWN environment
    before starting each child (the children, multiprocessing's resource tracker and any
    other helper inherit them). An exception in a rank is caught by the launcher, which
    prints or forwards it and exits 1 (DESIGN.md)."""
    world = a.world_size or DEFAULT_WORLD.get(a.fault, 2)
    port = _free_port()
    os.environ.update(
        WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    print(
        "launcher pid %d (%s): fault=%s world_size=%d port=%d"
        % (os.getpid(), a.launcher, a.fault, world, port),
        flush=True,
    )
    if a.launcher == "spawn":
        import torch.multiprocessing as tmp

        os.environ["RANK"] = "0"
        try:
            tmp.spawn(_in_process_rank, args=(a, world, port), nprocs=world, join=True)
        except Exception as e:  # ProcessRaisedException / ProcessExitedException
            print("launcher: %s" % (str(e).splitlines()[0] if str(e) else type(e).__name__), flush=True)
            return 1
        return 0
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    procs = []
    for rank in range(world):
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank))
        p = ctx.Process(target=_in_process_rank, args=(rank, a, world, port), name="rank%d" % rank)
        p.start()
        procs.append(p)
    first_bad = 0
    alive = list(procs)
    while alive:
        for p in list(alive):
            p.join(0.2)
            if p.exitcode is not None:
                alive.remove(p)
                if p.exitcode != 0 and first_bad == 0:
                    first_bad = 128 - p.exitcode if p.exitcode < 0 else p.exitcode
                    print("launcher: %s exited with %d" % (p.name, p.exitcode), flush=True)
    return first_bad


def launch(a):
    if a.launcher != "subprocess":
        return launch_in_process(a)
    world = a.world_size or DEFAULT_WORLD.get(a.fault, 2)
    port = _free_port()
    procs = []
    events = []  # (rank, returncode) in order of exit
    cond = threading.Condition()

    def reap(rank, proc):
        rc = proc.wait()
        with cond:
            events.append((rank, rc))
            cond.notify_all()

    def on_signal(signum, frame):
        for proc in procs:
            if proc.poll() is None:
                try:
                    proc.kill()
                except OSError:
                    pass
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    print("launcher pid %d: fault=%s world_size=%d port=%d" % (os.getpid(), a.fault, world, port), flush=True)
    for rank in range(world):
        env = dict(
            os.environ,
            RANK=str(rank),
            WORLD_SIZE=str(world),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        procs.append(subprocess.Popen(_worker_argv(a), env=env))
    for rank, proc in enumerate(procs):
        threading.Thread(target=reap, args=(rank, proc), daemon=True).start()
    first_bad = 0
    try:
        with cond:
            while len(events) < world:
                cond.wait(0.5)
                for rank, rc in events:
                    if rc != 0 and first_bad == 0:
                        first_bad = 128 - rc if rc < 0 else rc
                        print("launcher: rank %d exited with %d" % (rank, rc), flush=True)
    except KeyboardInterrupt:
        on_signal(signal.SIGINT, None)
    return first_bad


# ----------------------------------------------------------------------------- worker


def _die_with_parent(parent_pid):
    """Get SIGKILL when the launcher dies (Linux prctl PR_SET_PDEATHSIG), and close the race."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    except Exception:
        pass
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)

    def watch():  # belt and braces, e.g. non-Linux
        while True:
            time.sleep(1.0)
            if os.getppid() != parent_pid:
                os._exit(1)

    if parent_pid is not None:
        threading.Thread(target=watch, name="parent-watch", daemon=True).start()


class _Inputs:
    """Map-style dataset of random inputs (module level: spawn-started DataLoader workers
    unpickle it)."""

    def __init__(self, rank):
        self.rank = rank

    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        import torch

        return torch.randn(HIDDEN, generator=torch.Generator().manual_seed(i * 131 + self.rank))


class Job:
    def __init__(self, a):
        import datetime
        import torch
        import torch.distributed as dist

        self.torch, self.dist, self.a = torch, dist, a
        self.rank = int(os.environ["RANK"])
        self.world = int(os.environ["WORLD_SIZE"])
        timeout = datetime.timedelta(seconds=a.timeout_s)
        dist.init_process_group("gloo", timeout=timeout)
        cp = a.cp_size or (2 if self.world % 2 == 0 else 1)
        if self.world % cp:
            raise SystemExit("cp-size %d does not divide world size %d" % (cp, self.world))
        if a.fault == "cp-extra-microbatch" and (self.world != 4 or cp != 2):
            raise SystemExit("fault cp-extra-microbatch needs world size 4 and cp-size 2")
        self.cp_size, self.dp_size = cp, self.world // cp
        # Every rank creates every group, in the same order: CP groups, then DP groups.
        self.cp_group = self.dp_group = None
        for i in range(self.dp_size):
            ranks = list(range(i * cp, (i + 1) * cp))  # {0,1}, {2,3}
            g = self._new_group(ranks, "cp%d" % i, timeout)
            if self.rank in ranks:
                self.cp_group = g
        for j in range(cp):
            ranks = list(range(j, self.world, cp))  # {0,2}, {1,3}
            g = self._new_group(ranks, "dp%d" % j, timeout)
            if self.rank in ranks:
                self.dp_group = g
        self.dp_index = self.rank // cp
        torch.manual_seed(0)
        self.model = torch.nn.Linear(HIDDEN, 1)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.loss = 0.0
        self.batches = None
        if a.loader_workers:
            self.batches = iter(self._loader(a.loader_workers))
        print("rank %d ready pid %d" % (self.rank, os.getpid()), flush=True)

    def _loader(self, workers):
        """Micro-batch inputs from DataLoader workers (processes that inherit RANK)."""
        return self.torch.utils.data.DataLoader(
            _Inputs(self.rank), batch_size=8, num_workers=workers, persistent_workers=True
        )

    def _new_group(self, ranks, desc, timeout):
        try:
            return self.dist.new_group(ranks, timeout=timeout, group_desc=desc)
        except TypeError:  # torch without group_desc
            return self.dist.new_group(ranks, timeout=timeout)

    def fault_now(self, name, n):
        return self.a.fault == name and n == self.a.fault_step

    # -- phases ---------------------------------------------------------------------

    def rollout(self, n):
        torch, dist = self.torch, self.dist
        g = torch.Generator().manual_seed(1000 * n + self.dp_index)
        # Fake generation: each CP group produces the same BATCH sample lengths.
        lengths = torch.randint(8, 48, (BATCH,), generator=g, dtype=torch.int64)
        gathered = [torch.zeros(BATCH, dtype=torch.int64) for _ in range(self.world)]
        for _ in range(3):  # gather generated lengths, a few rounds
            dist.all_gather(gathered, lengths)
        # Decode loop: its length depends on the data; every iteration all_gathers the
        # token count on the world group.
        iters = DECODE_ITERS
        if self.fault_now("decode-loop", n) and self.rank == self.world - 1:
            iters += 1  # this rank's "data" needs one more token
        tokens = torch.zeros(1, dtype=torch.int64)
        counts = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world)]
        for _ in range(iters):
            tokens += 1
            dist.all_gather(counts, tokens)
        # Reward: normally computed locally; in stuck-queue, rank 1 waits for a reward
        # producer thread that died before producing anything.
        reward = float(lengths.float().mean())
        if self.fault_now("stuck-queue", n) and self.rank == 1:
            import queue

            q = queue.Queue()

            def producer():
                raise RuntimeError("reward model connection lost (simulated)")

            t = threading.Thread(target=producer, name="reward-producer", daemon=True)
            t.start()
            t.join()
            reward = q.get()  # never filled: blocks forever
        score = torch.tensor([reward])
        dist.all_reduce(score)  # scoring all_reduce (world)
        return [int(x) for x in torch.cat(gathered).tolist()]

    def train(self, n, all_lengths):
        torch, dist = self.torch, self.dist
        # This rank's CP group trains on the samples generated by its DP index.
        mine = all_lengths[self.rank * BATCH : (self.rank + 1) * BATCH]
        shared = all_lengths[
            self.dp_index * self.cp_size * BATCH : (self.dp_index * self.cp_size + 1) * BATCH
        ]
        n_micro = max(1, -(-sum(shared) // MICRO_TOKENS))
        if self.fault_now("cp-extra-microbatch", n) and self.rank == 1:
            # Bug: packs micro-batches from its own (uneven) view of the sample lengths,
            # which has one long sample more -> one micro-batch more than its CP peer.
            n_micro = max(1, -(-(sum(mine) + MICRO_TOKENS) // MICRO_TOKENS))
        self.opt.zero_grad()
        g = torch.Generator().manual_seed(n * 7919 + self.rank)
        total = 0.0
        for mb in range(n_micro):
            if self.a.step_sleep_s:
                time.sleep(self.a.step_sleep_s / n_micro)  # "compute"
            x = next(self.batches) if self.batches is not None else torch.randn(8, HIDDEN, generator=g)
            if self.fault_now("raise", n) and self.rank == 1:
                raise ValueError(
                    "bad batch shape (8, %d) at step %d: expected (8, %d)" % (HIDDEN - 1, n, HIDDEN)
                )
            if self.fault_now("cuda-oom", n) and self.rank == 1:
                # CPU stand-in for a real CUDA OOM: torch's own exception type and message
                raise torch.cuda.OutOfMemoryError(
                    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity of "
                    "79.15 GiB of which 1.02 GiB is free. (stand-in raised by train_faults.py)"
                )
            loss = self.model(x).pow(2).mean()
            loss.backward()
            total += float(loss.detach())
            for p in self.model.parameters():  # CP all_reduce per micro-batch
                dist.all_reduce(p.grad, group=self.cp_group)
            if self.fault_now("kill-rank", n) and self.rank == 1 and mb == 0:
                print("rank 1 pid %d: SIGKILL myself in train step %d" % (os.getpid(), n), flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
        for p in self.model.parameters():  # DP gradient sync
            dist.all_reduce(p.grad, group=self.dp_group)
            p.grad /= self.world
        self.opt.step()
        loss_t = torch.tensor([total / n_micro])
        if self.fault_now("mismatch", n) and self.rank == 1:
            dist.broadcast(loss_t, src=0)  # others all_reduce here
        else:
            dist.all_reduce(loss_t)  # loss logging (world)
        self.loss = float(loss_t) / self.world

    def evaluate(self, n):
        torch, dist = self.torch, self.dist
        with torch.no_grad():
            x = torch.randn(16, HIDDEN, generator=torch.Generator().manual_seed(n))
            v = torch.tensor([float(self.model(x).pow(2).mean())])
        dist.all_reduce(v)
        return float(v) / self.world

    def checkpoint(self, n):
        import tempfile

        torch, dist = self.torch, self.dist
        checksum = torch.tensor([float(sum(p.detach().sum() for p in self.model.parameters()))])
        dist.all_reduce(checksum)  # consistency check (world)
        if self.rank == 0:
            with tempfile.TemporaryDirectory(prefix="train_faults_ckpt_") as d:
                torch.save(self.model.state_dict(), os.path.join(d, "step%d.pt" % n))

    def run(self):
        a = self.a
        ckpt_fault_step = None
        if a.fault == "rank0-checkpoint":
            ckpt_fault_step = next((s for s in range(a.fault_step, a.steps + 1) if s % CKPT_EVERY == 0), None)
        t0 = time.time()
        for n in range(1, a.steps + 1):
            tracer.step(n)
            with tracer.phase("rollout", step=n):
                lengths = self.rollout(n)
            with tracer.phase("train", step=n):
                self.train(n, lengths)
            msg = "step %d done loss %.4f" % (n, self.loss)
            if n % EVAL_EVERY == 0:
                with tracer.phase("eval", step=n):
                    msg += " eval %.4f" % self.evaluate(n)
            if n % CKPT_EVERY == 0:
                if n == ckpt_fault_step:
                    # Bug: "only rank 0 saves", but the save path contains a collective.
                    if self.rank == 0:
                        with tracer.phase("checkpoint", step=n):
                            self.checkpoint(n)
                else:
                    with tracer.phase("checkpoint", step=n):
                        self.checkpoint(n)
                msg += " checkpoint"
            if self.rank == 0:
                print("%s (%.2fs)" % (msg, time.time() - t0), flush=True)
        self.dist.barrier()
        self.dist.destroy_process_group()
        if self.rank == 0:
            print("done: %d steps in %.2fs" % (a.steps, time.time() - t0), flush=True)


def worker(a):
    if a.parent_pid is not None:
        _die_with_parent(a.parent_pid)
    Job(a).run()
    return 0


def main(argv=None):
    a = parse_args(argv)
    if a.worker or (not a.launch and "RANK" in os.environ and "WORLD_SIZE" in os.environ):
        return worker(a)
    return launch(a)


if __name__ == "__main__":
    sys.exit(main())
