"""Interpreter start-up cost of having hangtrace installed, side by side in one run.

``python -c pass`` is timed (wall time of the whole child process, fork to exit) in
several interpreters, interleaved run by run so drift hits them alike:

  venv-empty      a fresh venv (no system site-packages) with nothing installed
  venv-wheel      the same kind of venv + ``pip install --no-deps`` of a hangtrace wheel
                  (ships ``hangtrace.pth``: the one line that checks HANGTRACE)
  venv-editable   the same kind of venv + ``pip install -e --no-deps`` (what developers
                  have: hangtrace.pth + setuptools' editable finder .pth)
  system          this interpreter as installed here (HANGTRACE unset)
  system+HT       this interpreter with HANGTRACE=1 (HANGTRACE_AUTO_WATCH=0, a temp
                  HANGTRACE_DIR): the bootstrap cost (ring file, lifecycle hooks, import
                  hooks), for information

The venvs differ only in what hangtrace's install put into site-packages, so
``venv-wheel − venv-empty`` is the cost of hangtrace installed and inactive (target:
≤ 1 ms). The venvs are built from a copy of the source tree in a temporary directory
(nothing is written into the repository) and removed afterwards. The wheel is built
with ``--no-build-isolation`` (this interpreter's setuptools; no network).

``system+HT − system`` is measured in the same interpreter, with every dependency of
the bootstrap present.

Traced vs untraced (``--traced``, issue 8): the same interpreter with this tree on
``PYTHONPATH``, HANGTRACE unset vs ``HANGTRACE=1``, for ``python -c pass`` and for
``python -c "import torch.distributed"`` (what a rank starts with), interleaved run by
run; wall time (fork to exit) and peak RSS (``ru_maxrss`` of the child from ``wait4``,
KiB). ``--baseline TREE`` adds the same traced runs with another source tree on
``PYTHONPATH`` (the previous code), side by side in the same run. Target: with
torch.distributed imported, traced ≤ untraced + 10 ms and + 4 MB.

Usage::

    python3 benchmarks/bench_startup.py [--runs 60] [--out results.json] [--keep DIR]
    python3 benchmarks/bench_startup.py --traced [--runs 20] [--baseline /path/to/old/tree]
    python3 benchmarks/bench_startup.py --traced --callgrind [--cg-repeats 3] [--baseline /path/to/old/tree]
"""

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from benchstats import median_ci

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _clean_env():
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("HANGTRACE") and k not in ("PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME")
    }
    return env


def _run(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        raise SystemExit(
            "%s failed (%d):\n%s\n%s" % (" ".join(cmd), p.returncode, p.stdout[-2000:], p.stderr[-3000:])
        )
    return p


def _copy_source(dst):
    """Copy the repository's sources (not .git, build outputs or caches) to ``dst``."""

    def ignore(d, names):
        return {
            n
            for n in names
            if n in (".git", "build", "dist", "__pycache__", ".pytest_cache") or n.endswith(".egg-info")
        }

    shutil.copytree(REPO, dst, ignore=ignore)


def build_venvs(root):
    """Create the three venvs under ``root``; returns ({name: python path}, notes).

    All three are made the same way (``python -m venv``, which installs pip and
    setuptools offline from ``ensurepip``), so they differ only by hangtrace's install.
    """
    env = _clean_env()
    src = os.path.join(root, "src")
    _copy_source(src)
    wheels = os.path.join(root, "wheels")
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", wheels, src],
        env=env,
        cwd=root,
    )
    wheel = [os.path.join(wheels, f) for f in os.listdir(wheels) if f.endswith(".whl")][0]
    pys = {}
    notes = []
    for name in ("venv-empty", "venv-wheel", "venv-editable"):
        d = os.path.join(root, name)
        _run([sys.executable, "-m", "venv", d], env=env)
        pys[name] = os.path.join(d, "bin", "python")
    _run(
        [pys["venv-wheel"], "-m", "pip", "install", "-q", "--no-index", "--no-deps", wheel], env=env, cwd=root
    )
    p = subprocess.run(
        [
            pys["venv-editable"],
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--no-build-isolation",
            "-e",
            src,
        ],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
    )
    if p.returncode != 0:
        errs = [ln.strip() for ln in p.stderr.splitlines() if "rror" in ln] or p.stderr.strip().splitlines()[
            -1:
        ]
        notes.append(
            "editable install into the venv failed, variant skipped (the venv's setuptools is "
            "ensurepip's, older than this interpreter's): %s" % (errs[-1] if errs else "?")
        )
        del pys["venv-editable"]
    return pys, notes


def _site_pth(python):
    out = _run(
        [
            python,
            "-c",
            "import site,os,json;d=site.getsitepackages()[0];"
            "print(json.dumps(sorted(f for f in os.listdir(d) if f.endswith('.pth'))))",
        ],
        env=_clean_env(),
    ).stdout
    return json.loads(out)


def _time_once(cmd, env):
    t0 = time.perf_counter_ns()
    p = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    dt = time.perf_counter_ns() - t0
    if p.returncode != 0:
        raise SystemExit("%s failed: %s" % (cmd, p.stderr.decode()[-2000:]))
    return dt


def _run_rusage(cmd, env):
    """(wall ms, peak RSS KiB, CPU ms) of one child run: fork to exit; ``ru_maxrss`` and
    user+system CPU time from wait4 (CPU time is what a loaded machine distorts least)."""
    t0 = time.perf_counter_ns()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    dt = time.perf_counter_ns() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    err = p.stderr.read()
    p.stderr.close()
    if p.returncode != 0:
        raise SystemExit("%s failed: %s" % (cmd, err.decode()[-2000:]))
    return dt / 1e6, ru.ru_maxrss, (ru.ru_utime + ru.ru_stime) * 1e3


def _traced_variants(run_dir, baseline=None):
    """``({variant: (argv, env)}, programs)`` of the traced-vs-untraced comparison: for
    ``pass`` and ``import torch.distributed``, untraced and traced with this tree (and with
    ``baseline``) on PYTHONPATH, bytecode cached in ``run_dir`` as a real install has it."""
    # Bytecode as in a real install: pip writes .pyc files, but this machine sets
    # PYTHONDONTWRITEBYTECODE=1, so every start would compile our sources (and only
    # ours: the stdlib and torch ship .pyc). A cache outside the trees, filled by warm-up.
    pyc = dict(PYTHONPYCACHEPREFIX=os.path.join(run_dir, "pycache"))
    trees = {"this": REPO}
    if baseline:
        trees["baseline"] = os.path.abspath(baseline)
    progs = {"pass": "pass", "torch.distributed": "import torch.distributed"}
    variants = {}
    for prog, code in progs.items():
        for tree, path in trees.items():
            base = dict(_clean_env(), PYTHONPATH=path, **pyc)
            base.pop("PYTHONDONTWRITEBYTECODE", None)
            if tree == "this":
                variants["%s, untraced" % prog] = ([sys.executable, "-c", code], base)
            variants["%s, traced (%s tree)" % (prog, tree)] = (
                [sys.executable, "-c", code],
                dict(
                    base, HANGTRACE="1", HANGTRACE_DIR=os.path.join(run_dir, tree), HANGTRACE_AUTO_WATCH="0"
                ),
            )
    return variants, progs


#: HANGTRACE_MEM_INTERVAL_S under callgrind: the default 1 s times callgrind's slowdown here
#: (torch's import: ~1.4 s natively, ~150 s under callgrind), so the sampler ticks as often
#: per unit of the program's progress as it does natively; one tick costs ~47k instructions
#: (measured: 150 ticks added 7.1M to a traced ``import torch.distributed``).
CALLGRIND_TIMER = 100.0
_MEM_INTERVAL = "HANGTRACE_MEM_INTERVAL_S"


def _callgrind_once(argv, env):
    """Instructions of one run of ``argv`` under callgrind (all threads). Raises
    SystemExit when the run fails."""
    p = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"] + argv,
        env=env,
        capture_output=True,
        text=True,
    )
    found = [ln for ln in p.stderr.splitlines() if "Collected :" in ln]
    if p.returncode != 0 or not found:
        raise SystemExit("callgrind run failed (%d):\n%s" % (p.returncode, p.stderr[-2000:]))
    return int(found[-1].split("Collected :")[1].split()[0])


def traced_instructions(baseline=None, repeats=1, jobs=2):
    """The same variants as ``traced_cost``, each run ``repeats`` times under callgrind
    (``valgrind --tool=callgrind``): instructions executed, all threads, independent of the
    machine's load (a traced ``import torch.distributed`` takes about 3 minutes under
    valgrind), ``jobs`` runs at a time. The memory sampler's timer is stretched by
    callgrind's slowdown (``CALLGRIND_TIMER``); every run has ``PYTHONHASHSEED=0`` (string
    hashes, hence dict and set layouts, are then the same in every run: random seeds
    moved a traced import by about 3M instructions run to run). What still varies:
    address-keyed tables (pybind11's type cache moved torch's import by up to 3M between
    runs of one tree), so with ``repeats`` > 1 the median is reported with the range.
    Returns ``{variant: [instructions per run]}`` and prints a table. Raises SystemExit
    without valgrind."""
    from concurrent.futures import ThreadPoolExecutor

    if shutil.which("valgrind") is None:
        raise SystemExit("--callgrind needs valgrind (apt-get install valgrind)")
    run_dir = tempfile.mkdtemp(prefix="ht-bench-startup-cg-")
    out = {}
    try:
        variants, progs = _traced_variants(run_dir, baseline)
        runs = []
        for n, (argv, env) in variants.items():
            # one thread each for OpenBLAS/OpenMP: their idle threads spin, and the spins
            # alone moved torch's import by tens of millions of instructions run to run
            env = dict(
                env, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONHASHSEED="0"
            )
            if "HANGTRACE" in env:
                # the memory sampler ticks once a second of wall time; under callgrind (about
                # 100x slower here) a 1.4 s import lasts ~150 s and would tick ~150 times
                # instead of once: the interval is scaled by the same factor (CALLGRIND_TIMER)
                env[_MEM_INTERVAL] = "%g" % CALLGRIND_TIMER
            subprocess.run(argv, env=env, check=True)  # fills the bytecode cache
            runs += [(n, argv, env)] * repeats
        with ThreadPoolExecutor(max(1, jobs)) as pool:
            counts = list(pool.map(lambda r: _callgrind_once(r[1], r[2]), runs))
        for (n, _, _), c in zip(runs, counts):
            out.setdefault(n, []).append(c)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    med = {n: statistics.median(v) for n, v in out.items()}
    L = [
        "### Start-up instructions, traced vs untraced (callgrind; %s, Python %s)"
        % (time.strftime("%Y-%m-%d"), platform.python_version()),
        "",
        "Traced runs with %s=%g (the 1 s default stretched by callgrind's ~100x slowdown); "
        "PYTHONHASHSEED=0; %d run(s) per variant, median (range)."
        % (_MEM_INTERVAL, CALLGRIND_TIMER, repeats),
        "",
        "| program | variant | instructions (M) | Δ vs untraced (M) |",
        "|---|---|---:|---:|",
    ]
    for prog in progs:
        ref = med["%s, untraced" % prog]
        for n in [x for x in out if x.startswith(prog + ",")]:
            rng = " (%.1f–%.1f)" % (min(out[n]) / 1e6, max(out[n]) / 1e6) if len(out[n]) > 1 else ""
            L.append(
                "| `%s` | %s | %.1f%s | %+.1f |"
                % (progs[prog], n.split(", ", 1)[1], med[n] / 1e6, rng, (med[n] - ref) / 1e6)
            )
    print("\n".join(L))
    return out


def traced_cost(runs, warmup, baseline=None):
    """Traced vs untraced start-up of ``-c pass`` and ``-c 'import torch.distributed'``.

    Returns ``{variant: {"ms": [...], "kib": [...]}}`` and prints a table."""
    run_dir = tempfile.mkdtemp(prefix="ht-bench-startup-run-")
    variants, progs = _traced_variants(run_dir, baseline)
    names = list(variants)
    out = {n: {"ms": [], "kib": [], "cpu_ms": []} for n in names}
    try:
        for n in names:
            for _ in range(max(1, warmup)):
                _run_rusage(*variants[n])
        load0 = os.getloadavg()
        for r in range(runs):
            for n in names[r % len(names) :] + names[: r % len(names)]:
                ms, kib, cpu = _run_rusage(*variants[n])
                out[n]["ms"].append(ms)
                out[n]["kib"].append(kib)
                out[n]["cpu_ms"].append(cpu)
        load1 = os.getloadavg()
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    med = statistics.median
    L = [
        "### Start-up, traced vs untraced (%s, %d CPUs, Python %s)"
        % (time.strftime("%Y-%m-%d"), os.cpu_count(), platform.python_version()),
        "",
        "%d runs per variant, interleaved; wall time fork to exit, peak RSS from wait4. Load average "
        "before/after: %.1f / %.1f." % (runs, load0[0], load1[0]),
        "",
        "| program | variant | median wall ms | p10–p90 wall ms | median CPU ms | median peak RSS MiB "
        "| Δ wall ms [95 % CI] | Δ CPU ms [95 % CI] | Δ RSS MiB |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def delta(key: str, n: str, ref: str) -> str:
        d = [a - b for a, b in zip(out[n][key], out[ref][key])]
        lo, hi = median_ci(d)
        return "%+.1f" % med(d) + ("" if lo != lo else " [%+.1f, %+.1f]" % (lo, hi))

    for prog in progs:
        ref = "%s, untraced" % prog
        for n in [x for x in names if x.startswith(prog + ",")]:
            xs = sorted(out[n]["ms"])
            d_mb = med([(a - b) / 1024 for a, b in zip(out[n]["kib"], out[ref]["kib"])])
            L.append(
                "| `%s` | %s | %.1f | %.1f–%.1f | %.1f | %.1f | %s | %s | %+.2f |"
                % (
                    progs[prog],
                    n.split(", ", 1)[1],
                    med(xs),
                    xs[len(xs) // 10],
                    xs[(len(xs) * 9) // 10],
                    med(out[n]["cpu_ms"]),
                    med(out[n]["kib"]) / 1024,
                    delta("ms", n, ref),
                    delta("cpu_ms", n, ref),
                    d_mb,
                )
            )
    L += [
        "",
        "Δ: median of the paired differences (run r of the variant minus run r untraced), vs the "
        "untraced run of the same program; [95 % CI]: the sign test's distribution-free interval of that "
        "median (benchstats.median_ci).",
    ]
    print("\n".join(L))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--traced", action="store_true", help="traced vs untraced start-up only (no venvs)")
    ap.add_argument("--baseline", help="with --traced: another source tree to compare, side by side")
    ap.add_argument("--runs", type=int, default=60, help="timed runs per variant (interleaved)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed runs per variant first")
    ap.add_argument("--out", help="write JSON results here")
    ap.add_argument("--keep", help="build the venvs in this directory and keep them")
    ap.add_argument(
        "--callgrind",
        action="store_true",
        help="with --traced: instructions per variant under callgrind instead of times",
    )
    ap.add_argument(
        "--cg-repeats", type=int, default=1, help="with --callgrind: runs per variant (median reported)"
    )
    ap.add_argument(
        "--cg-jobs",
        type=int,
        default=2,
        help="with --callgrind: runs at a time (counts do not depend on load)",
    )
    a = ap.parse_args(argv)
    if a.traced and a.callgrind:
        out = traced_instructions(a.baseline, a.cg_repeats, a.cg_jobs)
        if a.out:
            with open(a.out, "w") as f:
                json.dump(out, f, indent=2)
        return 0
    if a.traced:
        out = traced_cost(a.runs, a.warmup, a.baseline)
        if a.out:
            with open(a.out, "w") as f:
                json.dump(out, f, indent=2)
        return 0

    root = a.keep or tempfile.mkdtemp(prefix="ht-bench-startup-")
    os.makedirs(root, exist_ok=True)
    run_dir = tempfile.mkdtemp(prefix="ht-bench-startup-run-")
    t_start = time.time()
    try:
        pys, notes = build_venvs(root)
        base_env = _clean_env()
        ht_env = dict(base_env, HANGTRACE="1", HANGTRACE_DIR=run_dir, HANGTRACE_AUTO_WATCH="0")
        variants = {n: ([py, "-c", "pass"], base_env) for n, py in pys.items()}
        variants["system"] = ([sys.executable, "-c", "pass"], base_env)
        variants["system+HT"] = ([sys.executable, "-c", "pass"], ht_env)
        # the wheel venv really has our .pth, the empty one does not
        pth = {n: _site_pth(py) for n, py in pys.items()}
        assert "hangtrace.pth" in pth["venv-wheel"] and "hangtrace.pth" not in pth["venv-empty"], pth
        names = list(variants)
        for n in names:
            for _ in range(a.warmup):
                _time_once(*variants[n])
        times = {n: [] for n in names}
        load0 = os.getloadavg()
        for r in range(a.runs):
            order = names[r % len(names) :] + names[: r % len(names)]
            for n in order:
                times[n].append(_time_once(*variants[n]) / 1e6)
        load1 = os.getloadavg()
        rings = [f for f in os.listdir(run_dir) if f.startswith("ring-")]
    finally:
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(run_dir, ignore_errors=True)

    def st(xs):
        xs = sorted(xs)
        return {
            "median": statistics.median(xs),
            "p10": xs[len(xs) // 10],
            "p90": xs[(len(xs) * 9) // 10],
            "runs": times_raw(xs),
        }

    def times_raw(xs):
        return [round(x, 3) for x in xs]

    stats = {n: st(times[n]) for n in names}

    def paired(n, b):
        d = [x - y for x, y in zip(times[n], times[b])]
        return statistics.median(d)

    result = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "runs": a.runs,
        "loadavg_before": load0,
        "loadavg_after": load1,
        "pth_files": pth,
        "rings_written_with_HANGTRACE_1": len(rings),
        "ms": stats,
        "added_ms": {
            "installed, inactive (venv-wheel − venv-empty)": paired("venv-wheel", "venv-empty"),
            "bootstrap, HANGTRACE=1 (system+HT − system)": paired("system+HT", "system"),
        },
        "notes": notes,
        "wall_s": round(time.time() - t_start, 1),
    }
    if "venv-editable" in times:
        result["added_ms"]["editable install, inactive (venv-editable − venv-empty)"] = paired(
            "venv-editable", "venv-empty"
        )
    print(_table(result, names))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=2)
    return 0


LABELS = {
    "venv-empty": "venv, nothing installed",
    "venv-wheel": "venv + hangtrace wheel (HANGTRACE unset)",
    "venv-editable": "venv + hangtrace editable (HANGTRACE unset)",
    "system": "system interpreter (HANGTRACE unset)",
    "system+HT": "system interpreter, HANGTRACE=1",
}


def _table(r, names):
    L = [
        "### `python -c pass` start-up (%s, %d CPUs, Python %s)" % (r["date"], r["cpus"], r["python"]),
        "",
        "%d runs per variant, interleaved; wall time of the child process. Load average before/after: "
        "%.1f / %.1f." % (r["runs"], r["loadavg_before"][0], r["loadavg_after"][0]),
        "",
        "| interpreter | median ms | p10 ms | p90 ms |",
        "|---|---:|---:|---:|",
    ]
    for n in names:
        s = r["ms"][n]
        L.append("| %s | %.2f | %.2f | %.2f |" % (LABELS[n], s["median"], s["p10"], s["p90"]))
    L += ["", "| difference (median of paired runs) | ms |", "|---|---:|"]
    for k, v in r["added_ms"].items():
        L.append("| %s | %+.2f |" % (k, v))
    L += [
        "",
        "Target: installed and inactive adds ≤ 1 ms. With HANGTRACE=1 each run wrote a ring file "
        "(%d rings found)." % r["rings_written_with_HANGTRACE_1"],
    ]
    L += [
        "",
        "site-packages .pth files: "
        + "; ".join("%s: %s" % (n, ", ".join(v)) for n, v in r["pth_files"].items()),
    ]
    L += ["Note: " + n for n in r["notes"]]
    return "\n".join(L)


if __name__ == "__main__":
    sys.exit(main())
