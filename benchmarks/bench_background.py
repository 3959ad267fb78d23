"""Where tracing's CPU goes on a real training loop (issue 13): CPU time, not wall time.

Wall-time step medians on a 2-core machine shared with other people's test suites are
noise at the 1 % level; CPU seconds spent by each part of hangtrace are not (much less:
caches and frequency still move them a little). This benchmark runs the training loop of
``bench_training_loop.py`` (2 gloo DDP ranks, MLP, ``DataLoader(num_workers=2)`` re-created
each epoch) untraced (``base``) and traced (``ht``), interleaved for ``--rounds`` rounds,
and measures, all in CPU time:

* **node watcher** (the bench runs a copy of its poll loop, ``watcher.main``'s: ``poll``
  + ``any_alive``, every ``--poll-s`` s, on the traced run's directory, in a thread of
  this process; the job itself runs with ``HANGTRACE_AUTO_WATCH=0``): CPU per poll split
  exclusively into ring reading (``_read_headers``), ``/proc`` (``live_state``), Flight
  Recorder counter requests (``_fr_moved``, the watcher's side), the memory trend check
  (``memory_warnings``: every 5 s) and the rest; and CPU s per wall s;
* **FR agent** (in each rank: its thread's CPU clock, ``time.pthread_getcpuclockid``):
  per counter request answered;
* **memory sampler thread** per tick, per role: rank, DataLoader worker (the worker reports
  from a ``multiprocessing.util.Finalize`` just before it exits);
* **whole processes**: CPU of a rank and of a DataLoader worker, base vs ht (the sum of
  everything tracing adds there, incl. the per-collective wrapper, phase/step records);
* **after-fork handler** (rank 0, ``--forks`` bare fork+exit children): the child's CPU
  until it runs its own code, split into the new ring (``Runtime.new_recorder``) and each
  instrumentor's ``after_fork_child``; the child's whole CPU from fork to exit (its exit
  and its threads too: ``getrusage`` CHILDREN around each fork and wait); and the
  parent's fork+exit wall time;
* **per step** (rank 0, ABBA batches of thread CPU): ``tracer.step`` + ``tracer.phase``
  enter/exit, and one ``all_reduce`` through hangtrace's wrapper vs ``__wrapped__``.

The machine's load average is printed before and after. Usage::

    PYTHONPATH=. python benchmarks/bench_background.py [--rounds 2] [--epochs 20] [--out r.json]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable

HERE = os.path.abspath(__file__)
sys.path.insert(0, os.path.dirname(HERE))
from bench_training_loop import _free_port, communicate_all, ddp_setup, train_step  # noqa: E402
from bench_background_report import loadavg, print_tables, summarize  # noqa: E402

VARIANTS = {"base": {}, "ht": {"HANGTRACE": "1"}, "ht@before": {"HANGTRACE": "1"}}


def _ns() -> int:
    return time.thread_time_ns()


def thread_cpu_ns() -> dict:
    """{thread name: CPU ns} of every Python thread of this process (its CPU clock)."""
    out = {}
    for t in threading.enumerate():
        try:
            out[t.name] = time.clock_gettime_ns(time.pthread_getcpuclockid(t.ident))
        except (OSError, TypeError, AttributeError):
            pass
    return out


# --- children ----------------------------------------------------------------------------
def _count_ticks() -> None:
    """Count the memory sampler's timer ticks (class patched: forked workers inherit it)."""
    try:
        from hangtrace.hooks.mem import sampler
    except ImportError:
        return
    orig = sampler.Sampler.tick

    def tick(self: Any) -> None:
        self.bench_ticks = getattr(self, "bench_ticks", 0) + 1
        orig(self)

    sampler.Sampler.tick = tick


def _sampler_facts() -> dict:
    try:
        from hangtrace.hooks.mem import memory
    except ImportError:
        return {}
    s = memory.active()
    if s is None or s.thread is None:
        return {}
    try:
        cpu = time.clock_gettime_ns(time.pthread_getcpuclockid(s.thread.ident))
    except (OSError, TypeError):
        return {}
    return {"sampler_cpu_ns": cpu, "sampler_ticks": getattr(s, "bench_ticks", 0), "samples": s.nsamples}


def _worker_init(results_dir: str) -> Callable[[int], None]:
    def init(_wid: int) -> None:
        from multiprocessing import util

        try:  # a forked child may take its parent's sampler over (object and all): count its own ticks
            from hangtrace.hooks.mem import memory

            s = memory.active()
            if s is not None:
                s.bench_ticks = 0
        except ImportError:
            pass

        def report() -> None:
            d = dict(_sampler_facts(), pid=os.getpid(), cpu_ns=time.process_time_ns())
            with open(os.path.join(results_dir, "worker-%d.json" % os.getpid()), "w") as f:
                json.dump(d, f)

        util.Finalize(None, report, exitpriority=100)

    return init


def _abba_cpu(fn_a: Callable[[], Any], fn_b: Callable[[], Any], batches: int = 20, calls: int = 100) -> tuple:
    """Median thread-CPU ns per call of fn_a and fn_b, batches in ABBA order."""
    a, b = [], []
    for i in range(batches):
        for fn, acc in ((fn_a, a), (fn_b, b)) if i % 2 == 0 else ((fn_b, b), (fn_a, a)):
            t = _ns()
            for _ in range(calls):
                fn()
            acc.append((_ns() - t) / calls)
    return statistics.median(a), statistics.median(b)


def _fork_breakdown(n: int) -> dict:
    """Rank 0, traced: fork ``n`` bare children; each reports its CPU until its own code
    runs and the part of it spent in each piece of the after-fork handler."""
    bootstrap = sys.modules.get("hangtrace.hooks.bootstrap")  # imported only when traced
    rt = sys.modules["hangtrace.hooks.state"].active() if bootstrap is not None else None
    parts: dict = {}
    undo = []
    if rt is not None:

        def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
            def run(*a: Any, **k: Any) -> Any:
                t = time.process_time_ns()
                try:
                    return fn(*a, **k)
                finally:
                    parts[name] = parts.get(name, 0) + time.process_time_ns() - t

            return run

        rt.new_recorder = timed("new ring (new_recorder)", rt.new_recorder)
        undo.append((rt, "new_recorder"))
        for ins in bootstrap.INSTRUMENTORS:
            ins.after_fork_child = timed("instrumentor " + ins.name, ins.after_fork_child)
            undo.append((ins, "after_fork_child"))
    import resource

    walls, rows, wholes = [], [], []
    for _ in range(n):
        parts.clear()
        r, w = os.pipe()
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter_ns()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            os.write(w, json.dumps(dict(parts, total=time.process_time_ns())).encode())
            os._exit(0)
        os.close(w)
        os.waitpid(pid, 0)
        walls.append(time.perf_counter_ns() - t)
        ru2 = resource.getrusage(resource.RUSAGE_CHILDREN)  # (the child's whole life: its exit too)
        wholes.append(ru2.ru_utime + ru2.ru_stime - ru.ru_utime - ru.ru_stime)
        with os.fdopen(r) as f:
            rows.append(json.loads(f.read()))
    for obj, name in undo:
        delattr(obj, name)
    keys = sorted({k for row in rows for k in row})
    return {
        "fork_exit_wall_us": statistics.median(walls) / 1e3,
        "child_whole_cpu_us": statistics.median(wholes) * 1e6,
        "child_cpu_us": {k: statistics.median(row.get(k, 0) for row in rows) / 1e3 for k in keys},
    }


def child_train(a: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader
    from hangtrace import tracer

    traced = bool(os.environ.get("HANGTRACE"))
    if traced:
        _count_ticks()
    rank, model, opt, ds = ddp_setup(a)
    wdir = os.path.join(a.results, "rank%d" % rank)
    os.makedirs(wdir, exist_ok=True)
    step = 0
    cpu0, wall0 = time.process_time_ns(), time.perf_counter_ns()
    for _ in range(a.epochs):
        loader = DataLoader(
            ds, batch_size=32, num_workers=2, shuffle=False, worker_init_fn=_worker_init(wdir)
        )
        for x, y in loader:
            tracer.step(step)
            with tracer.phase("train"):
                train_step(model, opt, x, y)
            step += 1
    res = {
        "rank": rank,
        "loop_cpu_ns": time.process_time_ns() - cpu0,
        "loop_wall_ns": time.perf_counter_ns() - wall0,
        "steps": step,
        "threads_cpu_ns": thread_cpu_ns(),
    }
    res.update(_sampler_facts())
    workers = []
    for f in os.listdir(wdir):
        with open(os.path.join(wdir, f)) as fh:
            workers.append(json.load(fh))
    res["workers"] = workers
    dist.barrier()
    if traced:  # both ranks: the same collectives in the same order
        one = torch.ones(1)
        wrapped = getattr(dist.all_reduce, "__wrapped__", None)
        if wrapped is not None:
            w, u = _abba_cpu(lambda: dist.all_reduce(one), lambda: wrapped(one))
            res["allreduce_added_cpu_ns"] = w - u
    if rank == 0 and traced:
        ctr = [0]

        def api() -> None:
            ctr[0] += 1
            tracer.step(step + ctr[0])
            with tracer.phase("train"):
                pass

        t, e = _abba_cpu(api, lambda: None)
        res["step_phase_cpu_ns"] = t - e
    if rank == 0:  # untraced too: what a bare fork costs the child without hangtrace
        res.update(_fork_breakdown(a.forks))
    dist.barrier()
    print("RESULT " + json.dumps(res), flush=True)
    dist.destroy_process_group()


# --- the watcher copy ----------------------------------------------------------------------
class Excl:
    """Exclusive CPU (thread clock) per named part: a nested part's time is its own only."""

    def __init__(self) -> None:
        self.totals: dict = {}
        self.stack: list = []

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*a: Any, **k: Any) -> Any:
            t = _ns()
            self.stack.append(0)
            try:
                return fn(*a, **k)
            finally:
                inner = self.stack.pop()
                dt = _ns() - t
                self.totals[name] = self.totals.get(name, 0) + dt - inner
                if self.stack:
                    self.stack[-1] += dt

        return run


def watch_copy(run_dir: str, stop: threading.Event, poll_s: float, out: dict, profile: str = "") -> None:
    """``watcher.main``'s loop (poll + any_alive) with every part timed in CPU."""
    from hangtrace.tracer.watch import detector as W

    while not os.path.isdir(run_dir) and not stop.is_set():
        time.sleep(0.05)
    t = _ns()
    # what the first poll or memory check imports, timed apart: once per watcher, not per poll
    import numpy  # noqa: F401
    from hangtrace.tracer.analyze import memory  # noqa: F401
    from hangtrace.tracer.collect import frrequest  # noqa: F401

    out["import_ns"] = _ns() - t
    w = W.Watcher(run_dir)
    w.log = w.mem_log = lambda line: None
    ex = Excl()
    orig_live = W.live_state
    W.live_state = ex.wrap("/proc (live_state)", orig_live)
    for attr, name in (
        ("_read_headers", "ring headers (_read_headers)"),
        ("_fr_moved", "FR counter requests (_fr_moved)"),
        ("memory_warnings", "memory trend (memory_warnings)"),
    ):
        setattr(w, attr, ex.wrap(name, getattr(w, attr)))
    polls, total = 0, 0
    rings = []
    prof = None
    if profile:
        import cProfile

        prof = cProfile.Profile()
    try:
        while not stop.wait(poll_s):
            t = _ns()
            ex.stack.append(0)
            if prof is not None:
                prof.enable()
            w.poll()
            w.any_alive()
            if prof is not None:
                prof.disable()
            inner = ex.stack.pop()
            dt = _ns() - t
            ex.totals["rest of poll"] = ex.totals.get("rest of poll", 0) + dt - inner
            total += dt
            polls += 1
            rings.append(len(w.headers))
    finally:
        W.live_state = orig_live
        if prof is not None:
            prof.dump_stats(profile)
    out.update(
        polls=polls,
        cpu_ns=total,
        parts=ex.totals,
        rings_median=statistics.median(rings) if rings else 0,
        fr_requests=polls,
    )


# --- parent ------------------------------------------------------------------------------
def child_watch(a: argparse.Namespace) -> None:
    """The watcher copy in its own interpreter (so that a baseline tree's watcher can run
    beside this one's): polls until its stdin closes, prints its figures as JSON."""
    stop = threading.Event()

    def eof() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=eof, daemon=True).start()
    out: dict = {}
    watch_copy(a.watch, stop, a.poll_s, out, a.profile)
    print(json.dumps(out), flush=True)


def launch(name: str, extra: dict, a: argparse.Namespace, run_dir: str) -> tuple:
    """One 2-rank run; returns (rank results, watcher-copy figures or None)."""
    port = _free_port()
    results = tempfile.mkdtemp(prefix="bgres-")
    tree = a.baseline if name.endswith("@before") else os.path.dirname(os.path.dirname(HERE))
    procs = []
    for r in range(2):
        env = {k: v for k, v in os.environ.items() if not k.startswith("HANGTRACE")}
        env.update(
            extra,
            RANK=str(r),
            LOCAL_RANK=str(r),
            WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            HANGTRACE_DIR=run_dir,
            HANGTRACE_AUTO_WATCH="0",
            OMP_NUM_THREADS="1",
            PYTHONPATH=tree,
        )
        cmd = [
            sys.executable,
            HERE,
            "--child",
            "--epochs",
            str(a.epochs),
            "--steps",
            str(a.steps),
            "--results",
            results,
            "--forks",
            str(a.forks),
        ]
        procs.append(
            subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    watch = None
    if extra.get("HANGTRACE"):
        env = {k: v for k, v in os.environ.items() if not k.startswith("HANGTRACE")}
        env["PYTHONPATH"] = tree
        watch = subprocess.Popen(
            [
                sys.executable,
                HERE,
                "--watch",
                run_dir,
                "--poll-s",
                str(a.poll_s),
                "--profile",
                a.profile and "%s.%s" % (a.profile, name),
            ],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
    wout = None
    try:
        outs = communicate_all(procs)
    finally:
        if watch is not None:
            wo, _ = watch.communicate("", timeout=120)
            wout = json.loads(wo)
        subprocess.run(["rm", "-rf", results])
    for p, (o, e) in zip(procs, outs):
        if p.returncode != 0:
            raise SystemExit("%s failed (%d):\n%s" % (extra, p.returncode, e[-3000:]))
    res = [json.loads(l[7:]) for o, _ in outs for l in o.splitlines() if l.startswith("RESULT ")]
    return sorted(res, key=lambda r: r["rank"]), wout


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--results", default=None, help=argparse.SUPPRESS)
    p.add_argument("--watch", default=None, help=argparse.SUPPRESS)
    p.add_argument(
        "--baseline",
        default=None,
        help="another tree (e.g. a checkout of main): adds the variant ht@before, that tree's hooks and watcher",
    )
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--forks", type=int, default=20)
    p.add_argument(
        "--poll-s", type=float, default=1.0, help="the watcher copy's poll interval (HANGTRACE_POLL_S)"
    )
    p.add_argument("--variants", default="base,ht", help="comma list of %s" % ",".join(VARIANTS))
    p.add_argument("--profile", default="", help="cProfile the watcher copy's polls into this file (pstats)")
    p.add_argument("--out", default=None, help="write all figures as JSON")
    a = p.parse_args()
    if a.child:
        return child_train(a)
    if a.watch:
        return child_watch(a)
    print("load average before: %s" % loadavg())
    root = tempfile.mkdtemp(prefix="bench-bg-")
    names = a.variants.split(",") + (["ht@before"] if a.baseline else [])
    runs: dict = {n: [] for n in names}
    for rnd in range(a.rounds):
        for n in names[rnd % len(names) :] + names[: rnd % len(names)]:
            runs[n].append(launch(n, VARIANTS[n], a, os.path.join(root, "%s-%d" % (n, rnd))))
            print("round %d %s done (load %s)" % (rnd, n, loadavg()), file=sys.stderr, flush=True)
    subprocess.run(["rm", "-rf", root])
    s = summarize(runs)
    print_tables(s, a)
    print("\nload average after: %s" % loadavg())
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"summary": s, "runs": runs, "args": vars(a)}, f, indent=1)


if __name__ == "__main__":
    main()
