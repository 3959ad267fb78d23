"""Tracing on a real training loop (issue 13): step time and run-directory size, side by side.

A DDP training loop (gloo, 2 ranks = 2 real processes, an MLP, ``torch.set_num_threads(1)``)
runs ``--epochs`` epochs of ``--steps`` steps; its ``DataLoader(num_workers=2)`` is created
anew each epoch, so every epoch forks two worker processes per rank (what issue 13 saw). Each
step: forward, backward (DDP's C++ gradient all-reduce), optimizer step, and a loss
``all_reduce`` for logging (a Python-API collective hangtrace records), inside
``tracer.phase("train")`` with ``tracer.step(n)`` (no-ops untraced).

Variants, interleaved round by round (the order rotates each round, ``--rounds`` rounds):

  base       HANGTRACE unset
  ht         HANGTRACE=1 (C recorder when built, memory sampler on): what a user gets
  ht-mem0    HANGTRACE=1 HANGTRACE_MEM=0: the memory sampler's share
  ht-pure    HANGTRACE=1 HANGTRACE_PURE_PYTHON=1: the pure-Python recorder's share
  ht-watch   HANGTRACE=1 with the node watcher auto-started beside the job, as a user gets it
             (the other traced variants set HANGTRACE_AUTO_WATCH=0: no watcher)
  ht-fr0     HANGTRACE=1 HANGTRACE_FR=0: without our Flight Recorder agent (torch's own
             recorder runs in every variant at torch 2.13's default, 2000 entries, as
             users get it; before 2026-12-05 every variant ran with TORCH_FR_BUFFER_SIZE=0)
  ht-tick5   HANGTRACE=1 HANGTRACE_MEM_INTERVAL_S=5: the share of a forked worker's first
             sampler tick (its ring written to its file, its first sample), which a worker
             of this loop's short epochs then never reaches

``--pool A.json B.json ...`` prints the paired table over the rounds of earlier ``--out``
files together (runs of the same variants and loop; nothing is run).

``--baseline TREE`` adds ``<variant>@before`` for each traced variant: the same, with TREE's
hooks and watcher (PYTHONPATH=TREE), interleaved with this tree's. The load average is
printed before and after. CPU attribution (which part costs what): bench_background.py.

Reported per variant: the median over rounds of (a) the median step time (rank 0; the first
step of each epoch excluded, it waits for the new workers) and (b) the mean step time
(loop wall time / steps: includes the workers' start-up), min-max spread, and the added
percentage against ``base``. Then, paired by round (each traced run against the untraced
run of the same round: they ran next to each other), the median of the per-round ratio - 1
with its range and quartiles for (c) **the job's CPU per step**: ``getrusage`` SELF +
CHILDREN of each rank over its loop (the rank and every DataLoader worker it joined),
both ranks summed, split into ranks and workers - on a shared machine far steadier than
wall time, and with two ranks busy on two cores, what tracing adds to step time - and (a),
(b). ``--pin CPUS`` runs the whole job under ``taskset -c CPUS`` (``--pin 0``: all of it on
one CPU, so all tracing CPU becomes wall time: a conservative bound); ``--workers N``
changes the DataLoader workers per rank (0: none, for attribution). Where the time goes, measured directly inside rank 0:
first-batch latency of each epoch (worker start-up as the loop sees it), fork+exit of a bare
child (the after-fork handler: new ring, lifecycle hooks, sampler thread), ``create_ring``
alone, and one ``all_reduce`` through hangtrace's wrapper vs ``__wrapped__`` (ABBA batches).

Then, unless ``--no-footprint``: one traced run of ``--footprint-epochs`` (30) epochs, and the
run directory's size on disk (``du -s --block-size=1``) and apparent size.

With ``transformers`` and ``accelerate`` importable, a Hugging Face ``Trainer`` row: GPT-2
built from a tiny ``GPT2Config`` (never downloaded), same 2 ranks, gloo, ``dataloader_num_
workers=2``, base vs ht, ``--hf-rounds`` rounds, also paired by round; the row is skipped with the
reason otherwise. Neither package is a dependency of hangtrace or its tests; a venv beside the
installed torch gives them without touching it::

    python3 -m venv --system-site-packages /tmp/hfvenv && /tmp/hfvenv/bin/pip install transformers accelerate
    PYTHONPATH=. /tmp/hfvenv/bin/python benchmarks/bench_training_loop.py --no-loop --hf-rounds 10

(``--no-loop``: the ``Trainer`` row alone.)

Usage::

    python benchmarks/bench_training_loop.py [--rounds 3] [--epochs 5] [--steps 40] [--pin 0] [--out r.json]
"""

import argparse
from typing import Any
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from benchstats import median_ci

HERE = os.path.abspath(__file__)
VARIANTS = {
    "base": {},
    "ht": {"HANGTRACE": "1"},
    "ht-mem0": {"HANGTRACE": "1", "HANGTRACE_MEM": "0"},
    "ht-pure": {"HANGTRACE": "1", "HANGTRACE_PURE_PYTHON": "1"},
    "ht-watch": {"HANGTRACE": "1", "HANGTRACE_AUTO_WATCH": "1"},
    # torch's own Flight Recorder, which tracing turns on by default (config.configure_fr_env)
    "ht-fr0": {"HANGTRACE": "1", "HANGTRACE_FR": "0"},
    # a 5 s sampling interval: a DataLoader worker of this loop (epochs of ~1.3 s at
    # --concurrent) exits before its sampler's first tick, so its ring stays in memory
    "ht-tick5": {"HANGTRACE": "1", "HANGTRACE_MEM_INTERVAL_S": "5"},
}


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


# --- children ----------------------------------------------------------------------------
def _abba(fn_a, fn_b, batches: int = 30, calls: int = 100) -> tuple[float, float]:
    """Median ns per call of fn_a and fn_b, batches in ABBA order."""
    a, b = [], []
    for i in range(batches):
        for which in ((fn_a, a), (fn_b, b)) if i % 2 == 0 else ((fn_b, b), (fn_a, a)):
            t = time.perf_counter_ns()
            for _ in range(calls):
                which[0]()
            which[1].append((time.perf_counter_ns() - t) / calls)
    return statistics.median(a), statistics.median(b)


def _breakdown(dist, torch) -> dict:
    """Rank 0 only: fork+exit of a bare child, ring creation, per-collective cost."""
    out = {}
    times = []
    for _ in range(20):
        t = time.perf_counter_ns()
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        times.append(time.perf_counter_ns() - t)
    out["fork_exit_us"] = statistics.median(times) / 1e3
    from hangtrace.tracer.ring.layout import create_ring

    with tempfile.TemporaryDirectory() as d:
        times = []
        for i in range(20):
            t = time.perf_counter_ns()
            fd, mm, _ = create_ring(os.path.join(d, "r%d" % i), 16384)
            times.append(time.perf_counter_ns() - t)
            mm.close()
            os.close(fd)
        out["create_ring_us"] = statistics.median(times) / 1e3
    return out


def tree_cpu_ns() -> tuple:
    """CPU (user + system, ns) of this process and of its children waited for so far
    (``getrusage`` SELF, CHILDREN): a rank, and the DataLoader workers it joined."""
    import resource

    out = []
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        ru = resource.getrusage(who)
        out.append(int((ru.ru_utime + ru.ru_stime) * 1e9))
    return tuple(out)


def ddp_setup(a: argparse.Namespace) -> Any:
    """The loop's rank set-up (one torch thread, the gloo group from torchrun-style
    environment, the DDP MLP, SGD, ``a.steps`` batches of 32 per epoch): returns
    ``(rank, model, optimizer, dataset)``. Shared with ``bench_background.py``."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import TensorDataset

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(
        torch.nn.Sequential(
            torch.nn.Linear(256, 1024),
            torch.nn.ReLU(),
            torch.nn.Linear(1024, 1024),
            torch.nn.ReLU(),
            torch.nn.Linear(1024, 10),
        )
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    n = a.steps * 32
    return rank, model, opt, TensorDataset(torch.randn(n, 256), torch.randint(0, 10, (n,)))


def train_step(model: Any, opt: Any, x: Any, y: Any) -> None:
    """One step of the loop: forward, backward (DDP's C++ all-reduce), SGD, and one Python
    ``all_reduce`` of the loss (the wrapper's per-collective cost). Shared with
    ``bench_background.py``."""
    import torch
    import torch.distributed as dist

    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    dist.all_reduce(loss.detach())


def child_train(a: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader
    from hangtrace import tracer

    rank, model, opt, ds = ddp_setup(a)
    steps, first, epochs = [], [], []
    step = 0
    cpu0 = tree_cpu_ns()
    for _ in range(a.epochs):
        te = time.perf_counter_ns()
        loader = DataLoader(ds, batch_size=32, num_workers=a.workers, shuffle=False)  # new workers each epoch
        t = time.perf_counter_ns()
        for i, (x, y) in enumerate(loader):
            tracer.step(step)
            with tracer.phase("train"):
                train_step(model, opt, x, y)
            now = time.perf_counter_ns()
            (first if i == 0 else steps).append(now - t)
            t, step = now, step + 1
        epochs.append(time.perf_counter_ns() - te)
    del loader  # (exhausted: its workers were joined, so their CPU is in RUSAGE_CHILDREN)
    res = {
        "rank": rank,
        "step_median_ms": statistics.median(steps) / 1e6,
        "step_mean_ms": (sum(epochs) / step) / 1e6,
        "first_batch_ms": statistics.median(first) / 1e6,
        "self_cpu_ns": tree_cpu_ns()[0] - cpu0[0],
        "children_cpu_ns": tree_cpu_ns()[1] - cpu0[1],
        "steps": step,
    }
    one = torch.ones(1)
    # torch's own decorator also sets __wrapped__: only hangtrace's wrapper is compared
    wrapped = getattr(dist.all_reduce, "__wrapped__", None) if os.environ.get("HANGTRACE") else None
    if wrapped is not None:  # both ranks are traced alike: the same calls in the same order
        w, u = _abba(lambda: dist.all_reduce(one), lambda: wrapped(one))
        res["allreduce_added_us"] = (w - u) / 1e3
    dist.barrier()
    if rank == 0 and not a.no_breakdown:  # its forks would add rings to the footprint run
        res.update(_breakdown(dist, torch))
    dist.barrier()
    print("RESULT " + json.dumps(res), flush=True)
    dist.destroy_process_group()


def child_hf(a: argparse.Namespace) -> None:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=512, n_positions=64, n_embd=64, n_layer=2, n_head=2)
    model = GPT2LMHeadModel(cfg)

    class DS(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return a.steps * 8 * 2

        def __getitem__(self, i: int) -> dict:
            g = torch.Generator().manual_seed(i)
            ids = torch.randint(0, 512, (64,), generator=g)
            return {"input_ids": ids, "labels": ids}

    times = []

    class Timer(TrainerCallback):
        def on_step_begin(self, *args, **kw):  # type: ignore[no-untyped-def]
            self.t = time.perf_counter_ns()

        def on_step_end(self, *args, **kw):  # type: ignore[no-untyped-def]
            times.append(time.perf_counter_ns() - self.t)

    targs = TrainingArguments(
        output_dir=a.hf_out,
        per_device_train_batch_size=8,
        num_train_epochs=a.epochs,
        dataloader_num_workers=2,
        ddp_backend="gloo",
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    tr = Trainer(model=model, args=targs, train_dataset=DS(), callbacks=[Timer()])
    out = tr.train()
    import torch.distributed as dist

    if dist.is_initialized():  # (left to the interpreter's exit, gloo's threads once aborted an untraced run)
        dist.barrier()
        dist.destroy_process_group()
    if int(os.environ["RANK"]) == 0:
        print(
            "RESULT "
            + json.dumps(
                {
                    "step_median_ms": statistics.median(times) / 1e6,
                    "train_runtime_s": out.metrics["train_runtime"],
                    "steps": len(times),
                    "loss": out.training_loss,
                }
            ),
            flush=True,
        )


# --- parent ------------------------------------------------------------------------------
def communicate_all(procs, timeout_s=1800):
    """(stdout, stderr) of each process in ``procs``, waited for in turn (``timeout_s`` each);
    whatever still runs when this returns or raises is killed."""
    try:
        return [p.communicate(timeout=timeout_s) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(
    kind: str, extra: dict, a: argparse.Namespace, run_dir: str, epochs: int, footprint: bool = False
) -> dict:
    """Run the 2-rank job once; returns rank 0's RESULT dict. Raises SystemExit on failure."""
    return finish(start(kind, extra, a, run_dir, epochs, footprint), kind, extra)


def start(
    kind: str, extra: dict, a: argparse.Namespace, run_dir: str, epochs: int, footprint: bool = False
) -> list:
    """Start the 2-rank job; returns its two processes (``finish`` waits for them)."""
    port = _free_port()
    procs = []
    for r in range(2):
        env = {k: v for k, v in os.environ.items() if not k.startswith("HANGTRACE")}
        # (no TORCH_FR_BUFFER_SIZE: torch's Flight Recorder runs at torch 2.13's default, 2000
        # entries, traced or not, as users get it; until 2026-12-05 this set it to 0 for every
        # variant, so every run had no Flight Recorder and `ht-fr0` equalled `ht`)
        env = {
            k: v for k, v in env.items() if k not in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
        }
        env.update(
            RANK=str(r),
            LOCAL_RANK=str(r),
            WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            HANGTRACE_DIR=run_dir,
            HANGTRACE_AUTO_WATCH="0",
            OMP_NUM_THREADS="1",
            PYTHONPATH=os.path.dirname(os.path.dirname(HERE)),
        )  # this tree's hangtrace
        env.update(extra)  # ht-watch: the node watcher auto-starts, as for a user; @before: PYTHONPATH
        cmd = (
            (["taskset", "-c", a.pin] if getattr(a, "pin", None) else [])
            + [
                sys.executable,
                HERE,
                "--child",
                kind,
                "--epochs",
                str(epochs),
                "--steps",
                str(a.steps),
                "--workers",
                str(a.workers),
                "--hf-out",
                os.path.join(run_dir, "hf-out"),
            ]
            + (["--no-breakdown"] if footprint else [])
        )
        procs.append(
            subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    return procs


def finish(procs: list, kind: str, extra: dict) -> dict:
    """Wait for a job ``start`` started; rank 0's RESULT dict (with the job's CPU per step).
    Raises SystemExit on failure."""
    outs = communicate_all(procs)
    for p, (o, e) in zip(procs, outs):
        if p.returncode != 0:
            raise SystemExit("%s %s failed (%d):\n%s" % (kind, extra, p.returncode, e[-3000:]))
    res = [json.loads(l[7:]) for o, _ in outs for l in o.splitlines() if l.startswith("RESULT ")]
    r0 = next(r for r in res if r.get("rank", 0) == 0)
    if kind == "train" and len(res) == 2:  # both ranks and their workers: the job's CPU per step
        r0["ranks_cpu_ms_per_step"] = sum(r["self_cpu_ns"] for r in res) / r0["steps"] / 1e6
        r0["workers_cpu_ms_per_step"] = sum(r["children_cpu_ns"] for r in res) / r0["steps"] / 1e6
        r0["job_cpu_ms_per_step"] = r0["ranks_cpu_ms_per_step"] + r0["workers_cpu_ms_per_step"]
    return r0


def disk_usage(path: str) -> tuple[int, int, int]:
    """(bytes on disk per ``du -s --block-size=1``, apparent bytes, ring files)."""
    on_disk = int(
        subprocess.run(
            ["du", "-s", "--block-size=1", path], capture_output=True, text=True, check=True
        ).stdout.split()[0]
    )
    apparent = int(
        subprocess.run(
            ["du", "-s", "--block-size=1", "--apparent-size", path],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()[0]
    )
    rings = sum(1 for f in os.listdir(path) if f.startswith("ring-"))
    return on_disk, apparent, rings


def _ratio_cell(ratios: list) -> str:
    """``median % [95 % CI] (min to max; quartiles)`` of per-round ratios in %."""
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    lo, hi = median_ci(ratios)
    ci = "" if lo != lo else " [%+.2f, %+.2f]" % (lo, hi)
    return "%+.2f %%%s (%+.1f to %+.1f; %+.1f to %+.1f)" % (
        statistics.median(ratios),
        ci,
        min(ratios),
        max(ratios),
        q[0],
        q[2],
    )


def _spread(xs: list) -> str:
    return "%.3f (%.3f-%.3f)" % (statistics.median(xs), min(xs), max(xs))


def _rows(results: dict, keys: tuple, base: str) -> list:
    lines = []
    b = {k: statistics.median(r[k] for r in results[base]) for k in keys}
    for name, rs in results.items():
        cells = []
        for k in keys:
            xs = [r[k] for r in rs]
            added = "" if name == base else " (%+.1f %%)" % (100 * (statistics.median(xs) / b[k] - 1))
            cells.append(_spread(xs) + added)
        lines.append("| %s | %s |" % (name, " | ".join(cells)))
    return lines


def paired_rows(loop: dict, base: str, a: argparse.Namespace) -> list:
    """Added cost of each variant against ``base`` as the median over rounds of the
    per-round ratio (the two runs of a round ran next to each other, in the same load):
    the job's CPU per step (both ranks and every DataLoader worker they joined:
    ``getrusage`` SELF + CHILDREN over the loop), rank 0's median step and its mean step."""
    keys = (
        ("job_cpu_ms_per_step", "job CPU per step"),
        ("ranks_cpu_ms_per_step", "- the 2 ranks"),
        ("workers_cpu_ms_per_step", "- their workers"),
        ("step_median_ms", "median step"),
        ("step_mean_ms", "mean step incl. worker start-up"),
    )
    keys = tuple(
        k
        for k in keys
        if all(k[0] in r for rs in loop.values() for r in rs) and all(r[k[0]] for r in loop.get(base, []))
    )  # (--workers 0: no workers' CPU to divide by)
    lines = [
        "\n### Added by tracing, paired by round (%d rounds%s): median of the per-round ratio - 1 "
        "[95 %% confidence interval of that median, order statistics] (min-max; quartiles)\n"
        % (
            a.rounds,
            (", job pinned with `taskset -c %s`" % a.pin if a.pin else "")
            + (", the variants of a round run at the same time: `--concurrent`" if a.concurrent else ""),
        ),
        "| variant | %s |" % " | ".join(label for _, label in keys),
        "|---|%s" % ("---|" * len(keys)),
    ]
    if base in loop:
        lines.insert(
            3,
            "| %s (absolute, ms) | %s |"
            % (base, " | ".join(_spread([r[k] for r in loop[base]]) for k, _ in keys)),
        )
    for name, rs in loop.items():
        if name == base:
            continue
        cells = []
        for k, _ in keys:
            cells.append(_ratio_cell([100 * (r[k] / b[k] - 1) for r, b in zip(rs, loop[base])]))
        lines.append("| %s | %s |" % (name, " | ".join(cells)))
    return lines


def pool(a: argparse.Namespace) -> None:
    """Print ``paired_rows`` over the rounds of the ``--out`` files ``a.pool`` together:
    each file's rounds stay paired as they ran. Raises SystemExit naming a file that is
    unreadable, has no ``base`` rounds to pair with, or ran other variants or another loop
    (epochs, steps, workers, ``--concurrent``, ``--pin``)."""
    loop: dict = {}
    shape = None
    for path in a.pool:
        try:
            with open(path) as f:
                rep = json.load(f)
            got, args = rep["loop"], rep["args"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SystemExit("%s: not an --out file of this benchmark (%r)" % (path, e))
        this = (
            sorted(got),
            args.get("epochs"),
            args.get("steps"),
            args.get("workers"),
            bool(args.get("concurrent")),
            args.get("pin"),
        )
        if "base" not in got:
            raise SystemExit("%s: no base rounds to pair with (a run with --variants base,...)" % path)
        if shape is not None and this != shape:
            raise SystemExit(
                "%s: other variants or another loop than %s (%s); pool runs of one command"
                % (path, a.pool[0], this)
            )
        shape = this
        for name, rounds in got.items():
            loop.setdefault(name, []).extend(rounds)
    a.rounds, a.concurrent, a.pin = len(loop["base"]), shape[4], shape[5]
    print("pooled: %s" % ", ".join(a.pool))
    print("\n".join(paired_rows(loop, "base", a)))


def parent(a: argparse.Namespace) -> dict:
    report: dict = {"args": vars(a), "loop": {}, "hf": None, "footprint": None}
    names = list(VARIANTS) if not a.variants else a.variants.split(",")
    if a.baseline:  # the same variants with another tree's hooks (and watcher), interleaved
        for n in [n for n in names if n != "base"]:
            VARIANTS[n + "@before"] = dict(VARIANTS[n], PYTHONPATH=a.baseline)
            names.append(n + "@before")
    report["load_before"] = loadavg()
    print("load average before: %s" % report["load_before"])
    root = tempfile.mkdtemp(prefix="bench-training-")
    loop = {n: [] for n in names}
    for rnd in range(0 if a.no_loop else a.rounds):
        order = names[rnd % len(names) :] + names[: rnd % len(names)]
        if a.concurrent:  # every variant of the round at once: the same machine, at the same moment
            jobs = [
                (n, start("train", VARIANTS[n], a, os.path.join(root, "%s-%d" % (n, rnd)), a.epochs))
                for n in order
            ]
            for n, procs in jobs:
                loop[n].append(finish(procs, "train", VARIANTS[n]))
                print(
                    "round %d %-8s (load %s) %s" % (rnd, n, loadavg(), loop[n][-1]),
                    file=sys.stderr,
                    flush=True,
                )
            continue
        for n in order:
            d = os.path.join(root, "%s-%d" % (n, rnd))
            loop[n].append(launch("train", VARIANTS[n], a, d, a.epochs))
            print(
                "round %d %-8s (load %s) %s" % (rnd, n, loadavg(), loop[n][-1]), file=sys.stderr, flush=True
            )
    report["loop"] = loop
    if a.no_loop:
        if not a.no_hf:
            report["hf"] = hf_rows(a, root)
        if not a.keep:
            subprocess.run(["rm", "-rf", root])
        return report
    print(
        "\n### Step time, DDP loop (2 ranks, gloo, MLP, %d epochs x %d steps, DataLoader(num_workers=2) "
        "re-created each epoch), %d interleaved rounds: median (min-max) over rounds\n"
        % (a.epochs, a.steps, a.rounds)
    )
    print(
        "| variant | median step (ms) | mean step incl. worker start-up (ms) | first batch of an epoch (ms) |"
    )
    print("|---|---|---|---|")
    print("\n".join(_rows(loop, ("step_median_ms", "step_mean_ms", "first_batch_ms"), names[0])))
    print("\n".join(paired_rows(loop, names[0], a)))
    print("\n### Where the time goes (rank 0, measured directly; median over rounds)\n")
    print(
        "| variant | fork+exit of a bare child (µs) | create_ring, 16384 slots (µs) | all_reduce added by the wrapper (µs) |"
    )
    print("|---|---|---|---|")
    for n, rs in loop.items():
        rs = [r for r in rs if "fork_exit_us" in r]
        ar = [r["allreduce_added_us"] for r in rs if "allreduce_added_us" in r]
        print(
            "| %s | %.0f | %.0f | %s |"
            % (
                n,
                statistics.median(r["fork_exit_us"] for r in rs),
                statistics.median(r["create_ring_us"] for r in rs),
                "%.1f" % statistics.median(ar) if ar else "–",
            )
        )
    report["load_after_loop"] = loadavg()
    print("\nload average after the loop runs: %s" % report["load_after_loop"])
    if not a.no_hf:
        report["hf"] = hf_rows(a, root)
    if not a.no_footprint:
        d = os.path.join(root, "footprint")
        launch("train", VARIANTS["ht"], a, d, a.footprint_epochs, footprint=True)
        on_disk, apparent, rings = disk_usage(d)
        report["footprint"] = {"on_disk": on_disk, "apparent": apparent, "rings": rings}
        print(
            "\n### Run directory after a traced %d-epoch loop (2 ranks, num_workers=2 re-created each epoch)\n"
            % a.footprint_epochs
        )
        print("| ring files | on disk (`du -s --block-size=1`) | apparent size | target |\n|---|---|---|---|")
        print(
            "| %d | %.1f MB | %.1f MB | < 20 MB on disk: %s |"
            % (rings, on_disk / 1e6, apparent / 1e6, "met" if on_disk < 20e6 else "NOT met")
        )
    if not a.keep:
        subprocess.run(["rm", "-rf", root])
    return report


def hf_rows(a: argparse.Namespace, root: str) -> dict:
    try:
        import accelerate  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        print("\n### Hugging Face Trainer: skipped (%s; pip install transformers accelerate)" % e)
        return {"skipped": str(e)}
    res = {"base": [], "ht": []}
    for rnd in range(a.hf_rounds):
        for n in ("base", "ht") if rnd % 2 == 0 else ("ht", "base"):
            res[n].append(
                launch("hf", VARIANTS[n], a, os.path.join(root, "hf-%s-%d" % (n, rnd)), a.hf_epochs)
            )
            print("hf round %d %-4s %s" % (rnd, n, res[n][-1]), file=sys.stderr, flush=True)
    print(
        "\n### Hugging Face Trainer (tiny GPT-2 from GPT2Config, 2 ranks, gloo, dataloader_num_workers=2, "
        "%d epochs x %d steps), %d interleaved rounds\n" % (a.hf_epochs, a.steps, a.hf_rounds)
    )
    print("| variant | median step (ms) | Trainer train_runtime (s) |\n|---|---|---|")
    print("\n".join(_rows(res, ("step_median_ms", "train_runtime_s"), "base")))
    print(
        "\nPaired by round: ht against the base run of the same round, median of the per-round ratio - 1 "
        "[95 % confidence interval] (min-max; quartiles)\n"
    )
    print("| measure | added by tracing |\n|---|---|")
    for k, label in (("step_median_ms", "median step"), ("train_runtime_s", "Trainer train_runtime")):
        print(
            "| %s | %s |"
            % (label, _ratio_cell([100 * (r[k] / b[k] - 1) for r, b in zip(res["ht"], res["base"])]))
        )
    same = len({round(r["loss"], 6) for r in res["base"] + res["ht"]}) == 1
    print("\ntraining loss identical in every run: %s" % same)
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--child", choices=("train", "hf"), default=None, help=argparse.SUPPRESS)
    p.add_argument("--hf-out", default=None, help=argparse.SUPPRESS)
    p.add_argument("--no-breakdown", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--steps", type=int, default=40, help="steps per epoch")
    p.add_argument(
        "--workers", type=int, default=2, help="DataLoader workers per rank (0: none, for attribution)"
    )
    p.add_argument("--variants", default=None, help="comma list of %s" % ",".join(VARIANTS))
    p.add_argument(
        "--baseline",
        default=None,
        help="another tree (e.g. a checkout of main): adds VARIANT@before for "
        "each traced variant, run with that tree on PYTHONPATH",
    )
    p.add_argument(
        "--concurrent",
        action="store_true",
        help="run the variants of a round at the same time, side by "
        "side on the same cores (each sees the machine's other load as the others do), not one after another",
    )
    p.add_argument(
        "--pin",
        default=None,
        help="run the whole job (ranks and their workers) under `taskset -c PIN`, "
        "e.g. 0: all tracing CPU becomes step time (a conservative bound)",
    )
    p.add_argument("--footprint-epochs", type=int, default=30)
    p.add_argument("--no-footprint", action="store_true")
    p.add_argument("--no-hf", action="store_true")
    p.add_argument(
        "--no-loop", action="store_true", help="only the Hugging Face Trainer row (and no footprint run)"
    )
    p.add_argument("--hf-rounds", type=int, default=3)
    p.add_argument("--hf-epochs", type=int, default=3)
    p.add_argument("--keep", action="store_true", help="keep the run directories (printed on stderr)")
    p.add_argument("--out", default=None, help="write all figures as JSON")
    p.add_argument(
        "--pool",
        nargs="+",
        default=None,
        metavar="JSON",
        help="print the paired table over the rounds of these --out files together; run nothing",
    )
    a = p.parse_args()
    if a.pool:
        return pool(a)
    if a.child == "train":
        return child_train(a)
    if a.child == "hf":
        return child_hf(a)
    report = parent(a)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
