"""Added time per collective: hangtrace vs. PyTorch's Flight Recorder, side by side.

Every configuration runs in its own fresh interpreter, launched by this script, on a
world-size-1 gloo group (``init_method=tcp://127.0.0.1:<free port>``) doing a 1-float
``all_reduce`` in a loop. Repeats are interleaved (the order rotates every round) so
that machine drift hits every configuration alike.

Configurations (environment of the child):

  base   HANGTRACE unset, TORCH_FR_BUFFER_SIZE=0       (nothing recorded)
  ht     HANGTRACE=1 (own run dir, AUTO_WATCH=0), FR 0 (hangtrace only; C hot path
         when the extension hangtrace.hooks._fastrec is built)
  htpy   as ht, plus HANGTRACE_PURE_PYTHON=1           (hangtrace's pure-Python path)
  fr     HANGTRACE unset, TORCH_FR_BUFFER_SIZE=2000    (Flight Recorder only)
  both   HANGTRACE=1 and TORCH_FR_BUFFER_SIZE=2000

The in-process A/B (hangtrace runs) times the wrapper against ``__wrapped__`` in adjacent
batches, in wall time and in the calling thread's CPU time (``time.thread_time_ns``: the
wrapper runs on that thread, gloo's work on its own; time spent descheduled by other load
is not counted there).

Note: in torch 2.13 the Flight Recorder is ON by default (TORCH_FR_BUFFER_SIZE unset
gives entries too), so the baseline must set it to 0 explicitly. Each child verifies
after timing that its recorder really recorded: the hangtrace ring's progress counter
advanced by the number of calls (and which path recorded: C or Python), and ``_dump_fr_trace_json()`` holds ``gloo:all_reduce``
entries (gloo does record into the Flight Recorder) -- or holds none when FR is off.

A second, torch-free part times the recorder's ``issue()`` + ``complete()`` pair, the
full hangtrace wrapper around a no-op function (fake tensor and group), each through
the C and the pure-Python path, and a bare Python pass-through function layer, to show
where the added time goes.

Usage::

    python3 benchmarks/bench_collective.py [--iters 20000] [--repeats 7] [--out results.json]

Prints a markdown table; ``--out`` also writes the numbers as JSON.
"""

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

CONFIGS = {
    "base": {"HANGTRACE": None, "TORCH_FR_BUFFER_SIZE": "0"},
    "ht": {"HANGTRACE": "1", "TORCH_FR_BUFFER_SIZE": "0"},
    "htpy": {"HANGTRACE": "1", "TORCH_FR_BUFFER_SIZE": "0", "HANGTRACE_PURE_PYTHON": "1"},
    "fr": {"HANGTRACE": None, "TORCH_FR_BUFFER_SIZE": "2000"},
    "both": {"HANGTRACE": "1", "TORCH_FR_BUFFER_SIZE": "2000"},
}
LABELS = {
    "base": "(a) unwrapped, FR off",
    "ht": "(b) hangtrace on (default path), FR off",
    "htpy": "(b') hangtrace on, pure Python (HANGTRACE_PURE_PYTHON=1), FR off",
    "fr": "(c) Flight Recorder on (2000), hangtrace off",
    "both": "(d) hangtrace + Flight Recorder",
}


def _free_port():
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
    finally:
        s.close()


# --------------------------------------------------------------------------- child
def _p10(xs):
    return sorted(xs)[len(xs) // 10]


def child_collective(iters, warmup, batches, ab_pairs):
    """Run in a fresh interpreter: time all_reduce; print one JSON line (ns per call)."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % _free_port(), rank=0, world_size=1)
    t = torch.ones(1)
    ar = dist.all_reduce
    orig = getattr(ar, "__hangtrace_wrapped__", None)  # the original behind hangtrace's wrapper
    wrapped = orig is not None
    rec = None
    path = None
    if wrapped:
        from hangtrace.hooks import state
        from hangtrace.hooks.record.recorder import _fastrec

        rec = state.active().recorder
        path = "C" if _fastrec is not None and isinstance(ar, _fastrec.Call) else "Python"
    for _ in range(warmup):
        ar(t)
    progress0 = _ring_progress(rec)
    wall, cpu_ns = [], []
    clock = time.perf_counter_ns
    cpu = time.process_time_ns  # all threads of this process (gloo runs the op on its own thread)
    rng = range(iters)
    for _ in range(batches):
        c0 = cpu()
        t0 = clock()
        for _ in rng:
            ar(t)
        t1 = clock()
        c1 = cpu()
        wall.append((t1 - t0) / iters)
        cpu_ns.append((c1 - c0) / iters)
    out = {
        "wall_median": statistics.median(wall),
        "wall_p10": _p10(wall),
        "cpu_median": statistics.median(cpu_ns),
        "wrapped": wrapped,
        "path": path,
    }
    if rec is not None:
        out["ring_progress_delta"] = _ring_progress(rec) - progress0
        out["ring_expected"] = iters * batches
        # In-process A/B: the same group through the wrapper and through the original
        # function (``__wrapped__``), in adjacent batches (order ABBA), paired.
        # Also the calling thread's CPU clock (the wrapper runs on it; gloo's work runs on its
        # own threads): on a shared machine, time spent descheduled does not count there.
        tcpu = time.thread_time_ns
        diffs, cdiffs = [], []
        for i in range(ab_pairs):
            first, second = (orig, ar) if i % 2 == 0 else (ar, orig)
            c0 = tcpu()
            t0 = clock()
            for _ in rng:
                first(t)
            t1 = clock()
            c1 = tcpu()
            for _ in rng:
                second(t)
            t2 = clock()
            c2 = tcpu()
            d = ((t2 - t1) - (t1 - t0)) / iters
            diffs.append(d if first is orig else -d)
            dc = ((c2 - c1) - (c1 - c0)) / iters
            cdiffs.append(dc if first is orig else -dc)
        out["ab_added_median"] = statistics.median(diffs)
        out["ab_cpu_added_median"] = statistics.median(cdiffs)
    # --- verification (after timing) ---
    try:
        fr = json.loads(torch._C._distributed_c10d._dump_fr_trace_json())
        entries = fr.get("entries", [])
        out["fr_entries"] = len(entries)
        out["fr_profiling_names"] = sorted({e.get("profiling_name") for e in entries})
    except Exception as e:  # FR API missing or failing
        out["fr_error"] = repr(e)
    dist.destroy_process_group()
    print(json.dumps(out))


def _ring_progress(rec):
    if rec is None:
        return 0
    from hangtrace.tracer.ring import layout as F

    return F.LIVE_DONE.unpack_from(rec.mm, F.LIVE_DONE_OFF)[3]


def child_micro(iters, batches):
    """Torch-free: recorder pair, full wrapper around a no-op (C and pure-Python paths),
    a bare Python pass-through layer. Keys ending in ``_py`` are the pure-Python path, ``_c`` the C one."""
    import inspect

    from hangtrace.hooks.record import recorder as R
    from hangtrace.hooks.torchdist import torch_dist as TD
    from hangtrace.hooks.torchdist import torch_install as TI
    from hangtrace.tracer import config
    from hangtrace.tracer.ring import layout as F

    d = tempfile.mkdtemp(prefix="ht-bench-")
    try:
        clock = time.thread_time_ns  # CPU time of this thread: robust against other load
        res = {}

        def run(label, fn):
            per = []
            for _ in range(batches):
                t0 = clock()
                fn()
                per.append((clock() - t0) / iters)
            res[label] = statistics.median(per)

        rng = range(iters)

        def empty_loop():
            for _ in rng:
                pass

        # fake torch.distributed so the real wrapper can run without torch
        class _Shape(tuple):
            pass

        class FakeTensor:
            dtype = "torch.float32"
            shape = _Shape((1,))

            def numel(self):
                return 1

        class _C10d:
            @staticmethod
            def _get_default_group():
                return "pg0"

            @staticmethod
            def _get_process_group_name(pg):
                return "0"

        class FakeDist:
            distributed_c10d = _C10d

        def noop_all_reduce(tensor, op=None, group=None, async_op=False):
            return None

        params = list(inspect.signature(noop_all_reduce).parameters)

        def bare_w(*args, **kwargs):  # the least a Python wrapper costs
            return noop_all_reduce(*args, **kwargs)

        ft = FakeTensor()

        def call_plain():
            for _ in rng:
                noop_all_reduce(ft)

        def call_bare():
            for _ in rng:
                bare_w(ft)

        run("loop", empty_loop)
        run("noop_call", call_plain)
        run("python_noop_layer", call_bare)
        keys = ["noop_call", "python_noop_layer"]
        modes = [("py", "1")] + ([("c", "0")] if R._fastrec is not None else [])
        for mode, pure in modes:
            os.environ[config.PURE_PYTHON] = pure
            sub = os.path.join(d, mode)
            os.mkdir(sub)
            rec = R.Recorder(sub, "bench", 16384, lambda msg, key=None: None)
            issue, complete = rec.issue, rec.complete

            def pair():
                for _ in rng:
                    complete(issue(F.K_COLL, 1, 8, 1, 1, 8, 7, -1, 0))

            TD._state = TD._new_state(rec, lambda msg, key=None: None)  # what install() makes
            TD._state.dist = FakeDist
            ht_w = TI._wrap("all_reduce", noop_all_reduce, params)  # what install() installs
            res["path_" + mode] = (
                "C" if R._fastrec is not None and isinstance(ht_w, R._fastrec.Call) else "Python"
            )

            def call_ht():
                for _ in rng:
                    ht_w(ft)

            for fn in (pair, call_ht):  # warm caches (string interning, dicts)
                fn()
            run("issue_complete_" + mode, pair)
            run("hangtrace_wrapper_noop_" + mode, call_ht)
            keys += ["issue_complete_" + mode, "hangtrace_wrapper_noop_" + mode]
            TD._state = None
            rec.close()
        os.environ.pop(config.PURE_PYTHON, None)
        for k in keys:
            res[k] -= res["loop"]
        print(json.dumps(res))
    finally:
        shutil.rmtree(d, ignore_errors=True)


# --------------------------------------------------------------------------- parent
def _env_for(name, run_dir):
    env = dict(os.environ)
    for k in list(env):
        if k.startswith("HANGTRACE_"):
            del env[k]
    for k, v in CONFIGS[name].items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    if env.get("HANGTRACE"):
        env["HANGTRACE_DIR"] = run_dir
        env["HANGTRACE_AUTO_WATCH"] = "0"
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _run_child(argv, env, nice=0):
    def pre():
        if nice:
            try:
                os.nice(nice)
            except OSError:
                pass

    p = subprocess.run(
        [sys.executable, os.path.abspath(__file__)] + argv,
        env=env,
        preexec_fn=pre,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if p.returncode != 0:
        raise SystemExit("child %s failed (%d):\n%s" % (argv, p.returncode, p.stderr[-3000:]))
    return json.loads(p.stdout.strip().splitlines()[-1])


def _stats(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "runs": xs}


METRICS = ("wall_median", "wall_p10", "cpu_median")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=200, help="all_reduce calls per timed batch")
    ap.add_argument("--batches", type=int, default=100, help="timed batches per process")
    ap.add_argument("--warmup", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=7, help="fresh processes per configuration")
    ap.add_argument("--ab-pairs", type=int, default=100, help="in-process A/B batch pairs (hangtrace runs)")
    ap.add_argument("--configs", default="base,ht,htpy,fr,both")
    ap.add_argument("--micro-iters", type=int, default=200000)
    ap.add_argument(
        "--nice",
        type=int,
        default=-10 if os.geteuid() == 0 else 0,
        help="niceness increment for the children (negative = higher priority; root only)",
    )
    ap.add_argument("--out", help="write JSON results here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)

    if a.child == "collective":
        return child_collective(a.iters, a.warmup, a.batches, a.ab_pairs)
    if a.child == "micro":
        return child_micro(a.micro_iters, 7)

    names = [n.strip() for n in a.configs.split(",") if n.strip()]
    runs = {n: {m: [] for m in METRICS} for n in names}
    ab = {n: [] for n in names}
    ab_cpu = {n: [] for n in names}
    checks = {n: [] for n in names}
    root = tempfile.mkdtemp(prefix="ht-bench-coll-")
    t_start = time.time()
    load0 = os.getloadavg()
    try:
        for r in range(a.repeats):
            order = names[r % len(names) :] + names[: r % len(names)]
            for n in order:
                run_dir = os.path.join(root, "%s-%d" % (n, r))
                res = _run_child(
                    [
                        "--child",
                        "collective",
                        "--iters",
                        str(a.iters),
                        "--warmup",
                        str(a.warmup),
                        "--batches",
                        str(a.batches),
                        "--ab-pairs",
                        str(a.ab_pairs),
                    ],
                    _env_for(n, run_dir),
                    a.nice,
                )
                for m in METRICS:
                    runs[n][m].append(res[m])
                if "ab_added_median" in res:
                    ab[n].append(res["ab_added_median"])
                    ab_cpu[n].append(res["ab_cpu_added_median"])
                checks[n].append({k: v for k, v in res.items() if k not in METRICS})
                print(
                    "  round %d %-5s wall median %7.0f  p10 %7.0f  cpu %7.0f ns/op%s%s"
                    % (
                        r + 1,
                        n,
                        res["wall_median"],
                        res["wall_p10"],
                        res["cpu_median"],
                        "  A/B added %+.0f" % res["ab_added_median"] if "ab_added_median" in res else "",
                        "  (%s path)" % res["path"] if res.get("path") else "",
                    ),
                    file=sys.stderr,
                    flush=True,
                )
        micro = [
            _run_child(
                ["--child", "micro", "--micro-iters", str(a.micro_iters)], _env_for("base", root), a.nice
            )
            for _ in range(3)
        ]
    finally:
        shutil.rmtree(root, ignore_errors=True)

    # sanity: each configuration recorded what it should
    problems = []
    for n in names:
        for c in checks[n]:
            want_ht = CONFIGS[n]["HANGTRACE"] is not None
            want_fr = CONFIGS[n]["TORCH_FR_BUFFER_SIZE"] != "0"
            if c["wrapped"] != want_ht:
                problems.append("%s: wrapped=%s" % (n, c["wrapped"]))
            if want_ht and c.get("ring_progress_delta") != c.get("ring_expected"):
                problems.append(
                    "%s: ring progress %s != %s" % (n, c.get("ring_progress_delta"), c.get("ring_expected"))
                )
            if want_fr != bool(c.get("fr_entries")):
                problems.append("%s: fr_entries=%s" % (n, c.get("fr_entries")))
            if CONFIGS[n].get("HANGTRACE_PURE_PYTHON") and c.get("path") != "Python":
                problems.append("%s: path=%s, not Python" % (n, c.get("path")))

    result = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": _torch_version(),
        "loadavg_before": load0,
        "loadavg_after": os.getloadavg(),
        "nice": a.nice,
        "iters": a.iters,
        "warmup": a.warmup,
        "batches": a.batches,
        "repeats": a.repeats,
        "ab_pairs": a.ab_pairs,
        "configs": names,
        "problems": problems,
        "ns_per_all_reduce": {},
        "added_ns": {},
        "ratio_ht_over_fr": {},
    }
    for m in METRICS:
        result["ns_per_all_reduce"][m] = {n: _stats(runs[n][m]) for n in names}
        added = {}
        if "base" in names:
            for n in names:
                if n != "base":
                    # paired per round: neighbours in time share the machine's state
                    diffs = [x - b for x, b in zip(runs[n][m], runs["base"][m])]
                    added[n] = {"median": statistics.median(diffs), "paired": diffs}
        result["added_ns"][m] = added
        for n in ("ht", "htpy"):
            if n in added and "fr" in added and added["fr"]["median"] > 0:
                result["ratio_ht_over_fr"].setdefault(m, {})[n] = added[n]["median"] / added["fr"]["median"]
    result["paths"] = {
        n: sorted({str(c.get("path")) for c in checks[n]})
        for n in names
        if CONFIGS[n]["HANGTRACE"] is not None
    }
    result["ab_added_ns"] = {n: _stats(v) for n, v in ab.items() if v}
    result["ab_cpu_added_ns"] = {n: _stats(v) for n, v in ab_cpu.items() if v}
    result["micro_ns"] = {
        k: statistics.median(m[k] for m in micro) for k in micro[0] if not k.startswith("path_")
    }
    result["micro_paths"] = {k: v for k, v in micro[0].items() if k.startswith("path_")}
    result["micro_runs"] = micro
    result["fr_gloo_check"] = next((c for c in checks.get("fr", []) if c.get("fr_entries")), None)
    result["wall_s"] = round(time.time() - t_start, 1)
    print(_table(result, names))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=2)
    return 1 if problems else 0


def _torch_version():
    try:
        out = subprocess.run(
            [sys.executable, "-c", "import torch;print(torch.__version__)"],
            capture_output=True,
            text=True,
            env=_env_for("base", "/nonexistent"),
        )
        return out.stdout.strip()
    except Exception:
        return "?"


def _table(r, names):
    L = []
    L.append(
        "### all_reduce of 1 float, gloo, world size 1 (%s, %d CPUs, Python %s, torch %s)"
        % (r["date"], r["cpus"], r["python"], r["torch"])
    )
    L.append("")
    L.append(
        "%d fresh processes per configuration, interleaved (order rotates each round); per process "
        "%d batches x %d calls after %d warm-up calls. Load average before/after: %.1f / %.1f."
        % (r["repeats"], r["batches"], r["iters"], r["warmup"], r["loadavg_before"][0], r["loadavg_after"][0])
    )
    L.append("")
    L.append(
        "| configuration | wall ns/op, median of batches: median [min–max] over processes | added | "
        "wall p10 of batches: median | added | CPU ns/op (all threads) | added |"
    )
    L.append("|---|---:|---:|---:|---:|---:|---:|")
    for n in names:
        cells = []
        for m in METRICS:
            s = r["ns_per_all_reduce"][m][n]
            add = r["added_ns"][m].get(n, {}).get("median")
            if m == "wall_median":
                cells.append("%.0f [%.0f–%.0f]" % (s["median"], s["min"], s["max"]))
            else:
                cells.append("%.0f" % s["median"])
            cells.append("—" if add is None else "%+.0f" % add)
        L.append("| %s | %s |" % (LABELS[n], " | ".join(cells)))
    L.append("")
    L.append("added = median over rounds of (configuration − baseline of the same round), ns per all_reduce.")
    for n, paths in r.get("paths", {}).items():
        L.append("- %s: recorded through the **%s** path" % (LABELS[n], " / ".join(paths)))
    for m in METRICS:
        for n, ratio in r["ratio_ht_over_fr"].get(m, {}).items():
            L.append("- %s, %s: hangtrace added / Flight Recorder added = **%.2f**" % (m, n, ratio))
    for n, s in r["ab_added_ns"].items():
        L.append(
            "- %s, in-process A/B (wrapper vs. `__wrapped__`, adjacent batches): added **%+.0f** ns "
            "median [%+.0f … %+.0f] over processes" % (LABELS[n], s["median"], s["min"], s["max"])
        )
    for n, s in r.get("ab_cpu_added_ns", {}).items():
        L.append(
            "- %s, the same A/B in the calling thread's CPU time: added **%+.0f** ns median "
            "[%+.0f … %+.0f] over processes" % (LABELS[n], s["median"], s["min"], s["max"])
        )
    L.append("")
    L.append(
        "Targets (issue 10): hangtrace adds ≤ 500 ns per collective and ≤ what the Flight Recorder adds."
    )
    L.append("")
    L.append("| torch-free micro-benchmark (thread CPU time, median of 3 processes) | ns per call |")
    L.append("|---|---:|")
    m = r["micro_ns"]
    for k, label in (
        ("issue_complete_py", "Recorder.issue() + complete(), pure Python"),
        ("issue_complete_c", "Recorder.issue() + complete(), C"),
        ("noop_call", "plain call of a no-op all_reduce(t)"),
        ("python_noop_layer", "plain Python pass-through function around it (for scale)"),
        (
            "hangtrace_wrapper_noop_py",
            "hangtrace's installed wrapper around it (all of the recording), pure Python",
        ),
        ("hangtrace_wrapper_noop_c", "hangtrace's installed wrapper around it (all of the recording), C"),
    ):
        if k in m:
            L.append("| %s | %.0f |" % (label, m[k]))
    if r["fr_gloo_check"]:
        c = r["fr_gloo_check"]
        L.append("")
        L.append(
            "Flight Recorder check: `torch._C._distributed_c10d._dump_fr_trace_json()` held %d entries, "
            "profiling names %s (gloo records into FR)." % (c["fr_entries"], c["fr_profiling_names"])
        )
    if r["problems"]:
        L.append("")
        L.append("PROBLEMS: " + "; ".join(r["problems"]))
    return "\n".join(L)


if __name__ == "__main__":
    sys.exit(main())
