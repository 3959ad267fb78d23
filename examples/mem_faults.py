"""Memory faults for hangtrace's memory ledger and crash attribution (issue 5). CPU only.

Three faults, each a small 2-rank gloo job (one launcher process starts the ranks), each
modelled on a real incident in RL post-training:

``--fault grow`` - host memory grows every step in the trainer's ``train`` phase (it keeps
    a tensor per step, like a list of outputs that still hold their graph) until the
    kernel OOM-kills it. Rank 1 runs inside a **real child memory cgroup** the launcher
    creates (cgroup v1: ``/sys/fs/cgroup/memory/hangtrace-test-<pid>``, v2:
    ``/sys/fs/cgroup/hangtrace-test-<pid>``; ``memory.limit_in_bytes``/``memory.max`` =
    ``--limit-mb``), entered before the rank's interpreter starts (a shell joins it, then execs the rank), so the
    kill is the kernel's own: exit -9, the cgroup's ``oom_kill`` counter +1, an OOM-killer
    line in the kernel log. Where no cgroup can be created (not root, read-only cgroupfs)
    the rank instead runs a **self-watchdog stand-in** that SIGKILLs itself when its RSS
    passes the limit; it prints that it is a stand-in, and hangtrace will then (rightly)
    not call it a host OOM-kill. This is the plain-process version of the issue's Ray
    trainer actor; the Ray-actor variant is ``--fault ray-grow`` (see ``ray_grow`` below).
``--fault kept`` - validation every 2 steps, checkpoint every step; on the steps doing both,
    the checkpoint keeps the validation cache (it "saves the eval results" and holds on to
    them), so the rollout engine's next ``wake_up`` exceeds its pool budget and raises an
    out-of-memory error at step 5. **The pool is a stand-in for GPU memory**: a plain
    counter of bytes registered with ``tracer.gauge("kv_pool", ...)`` (no GPU here); the
    error raised is ``torch.cuda.OutOfMemoryError`` with a message saying it is a
    stand-in. hangtrace's ledger shows the pool kept across ``validation -> checkpoint`` on
    steps 2 and 4 and released on steps 1 and 3.
``--fault sigterm`` - rank 1 receives an external SIGTERM (sent by the launcher at step 3,
    as a scheduler or a user would) while its memory is low (in a 2 GiB child cgroup where
    one can be created): hangtrace says external SIGTERM, *not an OOM*.
``--fault none`` - the same loop without a fault.

Run it traced::

    python -m hangtrace run -- python examples/mem_faults.py --fault grow

Each run takes 10-25 s here (``import torch`` in two ranks dominates). The launcher exits
with the first failing rank's status (128+N for a signal); it removes the cgroup it made.
"""

import argparse
import os
import signal
import subprocess
import sys
import threading
import time

try:
    from hangtrace import tracer
except ImportError:  # runs without hangtrace too

    class _P:
        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

    class _T:
        def phase(self, name, step=None):
            return _P()

        def step(self, n):
            pass

        def gauge(self, *a, **k):
            pass

    tracer = _T()

FAULTS = ("none", "grow", "kept", "sigterm", "ray-grow")
MIB = 1 << 20
GIB = 1 << 30
VAL_EVERY = 2  # kept: validation on steps 2, 4, ...
CKPT_EVERY = 1  # kept: checkpoint every step
ENGINE_BYTES = 6 * GIB  # kept: weights + KV cache the engine takes at wake_up (simulated)
VAL_CACHE_BYTES = 1 * GIB  # kept: the validation cache (simulated)
POOL_BUDGET = 7 * GIB + VAL_CACHE_BYTES // 2  # room for one kept cache, not two


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fault", choices=FAULTS, default="none")
    p.add_argument("--steps", type=int, default=None, help="steps (default: 40 grow, 8 kept/sigterm/none)")
    p.add_argument(
        "--limit-mb",
        type=int,
        default=None,
        help="memory limit of rank 1's cgroup in MiB (default 450 grow, 2048 sigterm)",
    )
    p.add_argument("--grow-mb", type=int, default=24, help="grow: MiB kept per train step (default 24)")
    p.add_argument("--step-sleep-s", type=float, default=0.15, help="simulated compute per step")
    p.add_argument("--sigterm-step", type=int, default=3)
    p.add_argument("--no-cgroup", action="store_true", help="do not create a cgroup (grow: self-watchdog)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--watchdog-mb", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--parent-pid", type=int, default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.steps is None:
        a.steps = 40 if a.fault in ("grow", "ray-grow") else 8
    if a.limit_mb is None:
        a.limit_mb = {"grow": 450, "sigterm": 2048, "ray-grow": 400}.get(a.fault, 0)
    return a


# ------------------------------------------------------------------------------ cgroup
class Cgroup:
    """A child memory cgroup with a limit (v1 or v2), removed by ``remove()``."""

    def __init__(self, limit_bytes):
        self.path = self.version = None
        self.error = None
        name = "hangtrace-test-%d" % os.getpid()
        tries = []
        if os.path.isfile("/sys/fs/cgroup/memory/memory.limit_in_bytes") or os.path.isdir(
            "/sys/fs/cgroup/memory"
        ):
            tries.append((1, "/sys/fs/cgroup/memory/" + name))
        if os.path.isfile("/sys/fs/cgroup/cgroup.controllers"):
            tries.append((2, "/sys/fs/cgroup/" + name))
        for ver, path in tries:
            try:
                os.mkdir(path)
            except OSError as e:
                self.error = "%s: %s" % (path, e)
                continue
            try:
                if ver == 1:
                    self._write(path, "memory.limit_in_bytes", limit_bytes)
                    if os.path.exists(os.path.join(path, "memory.memsw.limit_in_bytes")):
                        self._write(path, "memory.memsw.limit_in_bytes", limit_bytes)  # no swap escape
                else:
                    self._write(path, "memory.max", limit_bytes)
                    if os.path.exists(os.path.join(path, "memory.swap.max")):
                        self._write(path, "memory.swap.max", 0)
            except OSError as e:
                self.error = "%s: %s" % (path, e)
                os.rmdir(path)
                continue
            self.path, self.version = path, ver
            return

    @staticmethod
    def _write(path, name, value):
        with open(os.path.join(path, name), "w") as f:
            f.write(str(value))

    def oom_kills(self):
        try:
            with open(
                os.path.join(self.path, "memory.oom_control" if self.version == 1 else "memory.events")
            ) as f:
                for line in f:
                    if line.startswith("oom_kill "):
                        return int(line.split()[1])
        except (OSError, TypeError):
            pass
        return None

    def remove(self):
        if not self.path:
            return
        for _ in range(50):
            try:
                os.rmdir(self.path)
                return
            except OSError:
                time.sleep(0.1)  # tasks still exiting


# ------------------------------------------------------------------------------ launcher
def _free_port():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def launch(a):
    port = _free_port()
    cg = None
    watchdog = 0
    if a.fault in ("grow", "sigterm") and a.limit_mb and not a.no_cgroup:
        cg = Cgroup(a.limit_mb * MIB)
        if cg.path:
            print(
                "launcher: rank 1 runs in memory cgroup v%d %s (limit %d MiB)"
                % (cg.version, cg.path, a.limit_mb),
                flush=True,
            )
        else:
            print("launcher: cannot create a memory cgroup (%s)" % cg.error, flush=True)
            cg = None
    if a.fault == "grow" and cg is None:
        watchdog = a.limit_mb
        print(
            "launcher: STAND-IN: rank 1 runs a self-watchdog that SIGKILLs itself when its RSS passes %d MiB; "
            "this is not a kernel OOM kill" % watchdog,
            flush=True,
        )
    procs = []
    try:
        for rank in range(2):
            env = dict(
                os.environ,
                RANK=str(rank),
                WORLD_SIZE="2",
                LOCAL_RANK=str(rank),
                LOCAL_WORLD_SIZE="2",
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
            )
            argv = [
                sys.executable,
                os.path.abspath(__file__),
                "--worker",
                "--fault",
                a.fault,
                "--steps",
                str(a.steps),
                "--grow-mb",
                str(a.grow_mb),
                "--step-sleep-s",
                str(a.step_sleep_s),
                "--parent-pid",
                str(os.getpid()),
            ]
            if rank == 1 and watchdog:
                argv += ["--watchdog-mb", str(watchdog)]
            if cg is not None and rank == 1:
                # a shell moves itself into the cgroup, then execs the rank (same pid): the
                # rank is inside before its interpreter allocates anything. (A preexec_fn
                # would run Python's at-fork hooks in the child, including a traced
                # launcher's.)
                argv = [
                    "/bin/sh",
                    "-c",
                    'echo $$ > "$0" && exec "$@"',
                    os.path.join(cg.path, "cgroup.procs"),
                ] + argv
            procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True))
        return _supervise(a, procs, cg)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        if cg is not None:
            cg.remove()


def _supervise(a, procs, cg):
    first = [0]
    lock = threading.Lock()

    def pump(rank, p):
        for line in p.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            if a.fault == "sigterm" and rank == 1 and line.startswith("rank 1 step %d " % a.sigterm_step):
                print(
                    "launcher: sending SIGTERM to rank 1 (pid %d), as a scheduler would" % p.pid, flush=True
                )
                p.send_signal(signal.SIGTERM)

    ts = [threading.Thread(target=pump, args=(r, p), daemon=True) for r, p in enumerate(procs)]
    for t in ts:
        t.start()
    while any(p.poll() is None for p in procs):
        for r, p in enumerate(procs):
            rc = p.poll()
            if rc not in (None, 0):
                with lock:
                    if not first[0]:
                        first[0] = 128 - rc if rc < 0 else rc
                        extra = ""
                        if cg is not None and r == 1:
                            extra = "; cgroup oom_kill counter now %s" % cg.oom_kills()
                        print("launcher: rank %d exited with %d%s" % (r, rc, extra), flush=True)
                        # keep the cgroup a few seconds: a node watcher reads its counter
                        deadline = time.time() + 3.0
        if first[0] and time.time() > deadline:
            break
        time.sleep(0.05)
    for t in ts:
        t.join(timeout=2)
    if not first[0]:  # every rank ended between two polls
        for r, p in enumerate(procs):
            rc = p.wait()
            if rc != 0:
                print("launcher: rank %d exited with %d" % (r, rc), flush=True)
                return 128 - rc if rc < 0 else rc
    return first[0]


# ------------------------------------------------------------------------------ worker
class Pool:
    """kept: a stand-in for a GPU memory pool (bytes are only counted, nothing allocated)."""

    def __init__(self, budget):
        self.budget, self.used, self.blocks = budget, 0, {}

    def alloc(self, name, nbytes):
        import torch

        if self.used + nbytes > self.budget:
            raise torch.cuda.OutOfMemoryError(
                "CUDA out of memory (stand-in: pool 'kv_pool' is a counter, not a GPU). Tried to allocate %.2f GiB; "
                "%.2f GiB of %.2f GiB in use" % (nbytes / GIB, self.used / GIB, self.budget / GIB)
            )
        self.blocks[name] = nbytes
        self.used += nbytes

    def free(self, name):
        self.used -= self.blocks.pop(name, 0)


def _die_with_parent(parent_pid):
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:
        pass
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)


def _watchdog(limit_mb):
    page = os.sysconf("SC_PAGE_SIZE")

    def run():
        while True:
            with open("/proc/self/statm") as f:
                rss = int(f.read().split()[1]) * page
            if rss > limit_mb * MIB:
                print(
                    "STAND-IN self-watchdog: RSS %d MiB > %d MiB: SIGKILL myself (not a kernel OOM kill)"
                    % (rss // MIB, limit_mb),
                    flush=True,
                )
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(0.02)

    threading.Thread(target=run, name="stand-in-watchdog", daemon=True).start()


def worker(a):
    import datetime
    import torch
    import torch.distributed as dist

    _die_with_parent(a.parent_pid)
    if a.watchdog_mb:
        _watchdog(a.watchdog_mb)
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    keep = []  # grow: what the train phase keeps every step
    pool = Pool(POOL_BUDGET)
    if a.fault == "kept":
        tracer.gauge("kv_pool", lambda: pool.used, limit=POOL_BUDGET)
    print("rank %d ready pid %d" % (rank, os.getpid()), flush=True)
    handed = None  # kept: the validation cache handed to the checkpoint
    for n in range(1, a.steps + 1):
        tracer.step(n)
        if a.fault == "kept":
            with tracer.phase("wake_up"):
                pool.alloc("engine", ENGINE_BYTES)
        with tracer.phase("rollout"):
            x = torch.randn(32, 64)
            lengths = torch.tensor([float(n)])
            dist.all_reduce(lengths)
        if a.fault == "kept":
            with tracer.phase("sleep"):
                pool.free("engine")
        with tracer.phase("train"):
            opt.zero_grad()
            loss = model(x).pow(2).mean()
            loss.backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
            opt.step()
            if a.fault == "grow" and rank == 1:
                t = torch.empty(a.grow_mb * MIB // 4)
                t.fill_(1.0)  # touch every page: RSS really grows
                keep.append(t)
            time.sleep(a.step_sleep_s)
        if a.fault == "kept" and n % VAL_EVERY == 0:
            with tracer.phase("validation"):
                pool.alloc("val_cache", VAL_CACHE_BYTES)
                v = torch.tensor([float(model(torch.ones(4, 64)).mean())])
                dist.all_reduce(v)
                if n % CKPT_EVERY == 0:
                    handed = "val_cache"  # the checkpoint will save the eval results
                else:
                    pool.free("val_cache")
        if a.fault == "kept" and n % CKPT_EVERY == 0:
            with tracer.phase("checkpoint"):
                c = torch.tensor([float(sum(p.sum() for p in model.parameters()))])
                dist.all_reduce(c)
                if handed:
                    # Bug: the eval results saved with the checkpoint still reference the
                    # validation cache, so it is never given back to the pool.
                    pool.blocks["kept_by_checkpoint_%d" % n] = pool.blocks.pop(handed)
                    handed = None
        print(
            "rank %d step %d done rss %d MiB pool %.1f GiB" % (rank, n, _rss() // MIB, pool.used / GIB),
            flush=True,
        )
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# ------------------------------------------------------------------------------ ray-grow
# ``--fault ray-grow`` (added after the three above): the issue's own shape. A local Ray
# (``ray.init(address="local", num_cpus=2)``: a cluster of its own, never one already
# running on the machine; hangtrace's env vars in the job's runtime_env), one Trainer
# actor named ``trainer-0`` whose ``train()`` keeps ``--grow-mb`` MiB per call (bytearrays,
# every page touched) in phase ``train``. The driver asks the actor for its pid, moves that
# worker process into a child memory cgroup (``--limit-mb``, default 400 MiB; swap too,
# where the cgroup has it) and calls ``train()`` step by step until the kernel OOM-kills the
# worker; it prints Ray's own error text (for this kill Ray says the worker "died
# unexpectedly", without naming the OOM), removes the cgroup once the pid is gone and
# shuts Ray down. Exit 137 on the kill, 1 if the actor outlived all steps, 2 without a
# cgroup (no stand-in here). The actor's own runtime_env adds RANK=0/WORLD_SIZE=1 (as a
# trainer launcher would), so hangtrace calls it rank 0.
class Trainer:
    """ray-grow: the trainer actor (made a Ray actor class in ``ray_grow``)."""

    def __init__(self):
        self.keep = []  # what the train phase keeps every step

    def pid(self):
        return os.getpid()

    def train(self, s, grow_mb, sleep_s):
        tracer.step(s)
        with tracer.phase("train", step=s):
            b = bytearray(grow_mb * MIB)
            for i in range(0, len(b), 4096):
                b[i] = 1  # touch every page: RSS really grows
            self.keep.append(b)
            time.sleep(sleep_s)
        return _rss()


def ray_grow(a):
    import ray

    run_dir = os.environ.get("HANGTRACE_DIR") or os.path.abspath("hangtrace-run")
    env = {"HANGTRACE": "1", "HANGTRACE_DIR": run_dir, "HANGTRACE_AUTO_WATCH": "0"}
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        runtime_env={"env_vars": env},
        log_to_driver=True,
    )
    cg = None
    try:
        # RANK/WORLD_SIZE as a trainer launcher sets them: hangtrace names the actor rank 0
        actor = (
            ray.remote(num_cpus=1, max_restarts=0)(Trainer)
            .options(
                name="trainer-0",
                runtime_env={"env_vars": dict(env, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")},
            )
            .remote()
        )
        pid = ray.get(actor.pid.remote(), timeout=120)
        cg = Cgroup(a.limit_mb * MIB)
        if not cg.path:
            print(
                "driver: cannot create a memory cgroup (%s); ray-grow has no stand-in" % cg.error, flush=True
            )
            cg = None
            return 2
        Cgroup._write(cg.path, "cgroup.procs", pid)
        print(
            "driver: Trainer 'trainer-0' pid %d moved into memory cgroup v%d %s (limit %d MiB)"
            % (pid, cg.version, cg.path, a.limit_mb),
            flush=True,
        )
        errors = (ray.exceptions.RayActorError,)
        if hasattr(ray.exceptions, "ActorDiedError"):
            errors += (ray.exceptions.ActorDiedError,)
        for s in range(1, a.steps + 1):
            try:
                rss = ray.get(actor.train.remote(s, a.grow_mb, a.step_sleep_s), timeout=120)
            except errors as e:
                print(
                    "driver: trainer-0 died in train step %d; cgroup oom_kill counter %s"
                    % (s, cg.oom_kills()),
                    flush=True,
                )
                print("driver: Ray says: %s" % " ".join(str(e).split())[:1000], flush=True)
                return 137
            print("driver: trainer-0 step %d done rss %d MiB" % (s, rss // MIB), flush=True)
        print("driver: trainer-0 survived %d steps (no kill)" % a.steps, flush=True)
        return 1
    finally:
        if cg is not None:
            for _ in range(100):  # rmdir only once the worker is gone
                if not os.path.exists("/proc/%d" % pid):
                    break
                time.sleep(0.1)
            cg.remove()
        ray.shutdown()


def main(argv=None):
    a = parse_args(argv)
    if a.worker:
        return worker(a)
    if a.fault == "ray-grow":
        return ray_grow(a)
    return launch(a)


if __name__ == "__main__":
    sys.exit(main())
