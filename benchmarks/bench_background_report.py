"""Tables of ``bench_background.py``: medians over rounds of what the runs measured, printed
as the markdown of benchmarks/README.md. Imported by that script only."""

import argparse
import statistics
from typing import Any, Callable, Dict


def _med(xs: list) -> float:
    return statistics.median(xs) if xs else float("nan")


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def summarize(runs: dict) -> dict:
    """Medians over rounds of everything the tables print."""
    s: dict = {}
    for n, rs in runs.items():
        rank_cpu = [r["loop_cpu_ns"] / r["steps"] for ranks, _ in rs for r in ranks]
        walls = [r["loop_wall_ns"] for ranks, _ in rs for r in ranks]
        workers = [w for ranks, _ in rs for r in ranks for w in r["workers"]]
        s[n] = {
            "rank_cpu_per_step_us": _med(rank_cpu) / 1e3,
            "loop_wall_s": _med(walls) / 1e9,
            "worker_cpu_ms": _med([w["cpu_ns"] for w in workers]) / 1e6,
            "workers": len(workers),
        }
        r0 = [r for ranks, _ in rs for r in ranks if "child_cpu_us" in r]
        if r0:
            s[n]["fork"] = {
                "fork_exit_wall_us": _med([r["fork_exit_wall_us"] for r in r0]),
                "child_whole_cpu_us": _med([r.get("child_whole_cpu_us", float("nan")) for r in r0]),
                "child_cpu_us": {k: _med([r["child_cpu_us"][k] for r in r0]) for k in r0[0]["child_cpu_us"]},
            }
        if n == "base":
            continue
        wt = [w for w in workers if w.get("sampler_ticks")]
        s[n]["worker_sampler_us_per_tick"] = (
            _med([w["sampler_cpu_ns"] / w["sampler_ticks"] for w in wt]) / 1e3
        )
        s[n]["worker_sampler_cpu_ms"] = (
            _med([w["sampler_cpu_ns"] for w in workers if "sampler_cpu_ns" in w]) / 1e6
        )
        rk = [r for ranks, _ in rs for r in ranks if r.get("sampler_ticks")]
        s[n]["rank_sampler_us_per_tick"] = _med([r["sampler_cpu_ns"] / r["sampler_ticks"] for r in rk]) / 1e3
        s[n]["rank_sampler_cpu_s_per_s"] = _med([r["sampler_cpu_ns"] / r["loop_wall_ns"] for r in rk])
        wc = [x for _, x in rs if x and x["polls"]]
        s[n]["watcher"] = {
            "polls": sum(x["polls"] for x in wc),
            "rings": _med([x["rings_median"] for x in wc]),
            "ms_per_poll": _med([x["cpu_ns"] / x["polls"] for x in wc]) / 1e6,
            "parts_ms_per_poll": {
                k: _med([x["parts"].get(k, 0) / x["polls"] for x in wc]) / 1e6
                for k in sorted({k for x in wc for k in x["parts"]})
            },
        }
        agent = [
            (r["threads_cpu_ns"].get("hangtrace-fr-agent", 0), x["polls"], r["loop_wall_ns"])
            for (ranks, x) in rs
            if x
            for r in ranks
        ]
        s[n]["fr_agent_us_per_request"] = _med([c / p for c, p, _ in agent if p]) / 1e3
        s[n]["fr_agent_cpu_s_per_s"] = _med([c / wall for c, _, wall in agent])
        s[n]["watcher"]["import_ms"] = _med([x.get("import_ns", 0) for x in wc]) / 1e6
        if r0:
            s[n]["step_phase_cpu_us"] = _med([r["step_phase_cpu_ns"] for r in r0]) / 1e3
            s[n]["allreduce_added_cpu_us"] = (
                _med([r.get("allreduce_added_cpu_ns", float("nan")) for r in r0]) / 1e3
            )
    return s


def print_tables(s: dict, a: argparse.Namespace) -> None:
    traced = [n for n in ("ht@before", "ht") if n in s]
    step_s = s["base"]["loop_wall_s"] / (a.epochs * a.steps) if "base" in s else float("nan")

    def row(label: str, fn: Callable[[Dict[str, Any]], str]) -> None:
        cells = []
        for n in traced:
            try:
                cells.append(fn(s[n]))
            except (KeyError, TypeError, ZeroDivisionError):
                cells.append("–")
        print("| %s | %s |" % (label, " | ".join(cells)))

    print(
        "\n#### CPU attribution, traced 2-rank DDP loop (%d epochs x %d steps, 2 DataLoader workers per rank "
        "re-created each epoch), median over %d rounds; each cell: CPU per event, then CPU s per wall s\n"
        % (a.epochs, a.steps, a.rounds)
    )
    print("| part | %s |\n|---|%s" % (" | ".join(traced), "---|" * len(traced)))
    row(
        "node watcher, one poll (1 per %.1f s): all" % a.poll_s,
        lambda h: (
            "%.2f ms; %.4f" % (h["watcher"]["ms_per_poll"], h["watcher"]["ms_per_poll"] / 1e3 / a.poll_s)
        ),
    )
    keys = sorted({k for n in traced for k in s[n]["watcher"]["parts_ms_per_poll"]})
    for k in keys:
        row(
            "- " + k,
            lambda h, k=k: (
                "%.3f ms; %.4f"
                % (
                    h["watcher"]["parts_ms_per_poll"][k],
                    h["watcher"]["parts_ms_per_poll"][k] / 1e3 / a.poll_s,
                )
            ),
        )
    row("- ring files in the run directory (median over polls)", lambda h: "%d" % h["watcher"]["rings"])
    row("- one-time imports at the watcher's start (ms)", lambda h: "%.0f" % h["watcher"]["import_ms"])
    row(
        "FR agent, per counter request answered (2 ranks; per poll)",
        lambda h: "%.0f µs; %.4f" % (h["fr_agent_us_per_request"], 2 * h["fr_agent_cpu_s_per_s"]),
    )
    row(
        "memory sampler thread, rank (per tick; 2 ranks)",
        lambda h: "%.0f µs; %.4f" % (h["rank_sampler_us_per_tick"], 2 * h["rank_sampler_cpu_s_per_s"]),
    )
    row(
        "memory sampler thread, DataLoader worker (per tick; whole thread per worker)",
        lambda h: "%.0f µs; %.2f ms" % (h["worker_sampler_us_per_tick"], h["worker_sampler_cpu_ms"]),
    )
    row(
        "`tracer.step` + `tracer.phase` enter/exit, per step (rank 0; 2 ranks)",
        lambda h: "%.1f µs; %.4f" % (h["step_phase_cpu_us"], 2 * h["step_phase_cpu_us"] / 1e6 / step_s),
    )
    row(
        "all_reduce through the wrapper vs `__wrapped__`, per call (rank 0; 2 ranks, 1 per step)",
        lambda h: (
            "%.1f µs; %.4f" % (h["allreduce_added_cpu_us"], 2 * h["allreduce_added_cpu_us"] / 1e6 / step_s)
        ),
    )
    forks = 4 * a.epochs / (s["base"]["loop_wall_s"] if "base" in s else float("nan"))
    row(
        "a forked child's CPU until its own code runs, traced (4 forks per epoch)",
        lambda h: "%.0f µs" % h["fork"]["child_cpu_us"]["total"],
    )
    pk = sorted({k for n in traced for k in s[n].get("fork", {}).get("child_cpu_us", {}) if k != "total"})
    for k in pk:
        row("- " + k, lambda h, k=k: "%.0f µs" % h["fork"]["child_cpu_us"][k])
    if "base" in s and "fork" in s["base"]:
        bf = s["base"]["fork"]
        row(
            "- the same child untraced: %.0f µs; added by tracing" % bf["child_cpu_us"]["total"],
            lambda h: (
                "%.0f µs; %.4f"
                % (
                    h["fork"]["child_cpu_us"]["total"] - bf["child_cpu_us"]["total"],
                    (h["fork"]["child_cpu_us"]["total"] - bf["child_cpu_us"]["total"]) / 1e6 * forks,
                )
            ),
        )
        row(
            "a forked child's whole CPU, fork to exit (untraced %.0f µs); added by tracing"
            % bf["child_whole_cpu_us"],
            lambda h: (
                "%.0f µs; %.4f"
                % (
                    h["fork"]["child_whole_cpu_us"] - bf["child_whole_cpu_us"],
                    (h["fork"]["child_whole_cpu_us"] - bf["child_whole_cpu_us"]) / 1e6 * forks,
                )
            ),
        )
        row(
            "bare fork+exit as the parent sees it (wall; untraced %.0f µs)" % bf["fork_exit_wall_us"],
            lambda h: "%.0f µs" % h["fork"]["fork_exit_wall_us"],
        )
    print(
        "\n(CPU s per wall s is of one core; the machine has 2. Rates: polls every %.1f s, sampler ticks every "
        "1 s, steps and forks at the base loop's pace: %.1f ms per step, %.1f forks per s.)\n"
        % (a.poll_s, step_s * 1e3, forks)
    )
    if "base" not in s:
        return
    b = s["base"]
    print("| whole process, CPU | base | %s |\n|---|---|%s" % (" | ".join(traced), "---|" * len(traced)))
    for label, k, scale in (
        ("rank, per step (µs)", "rank_cpu_per_step_us", 1),
        ("DataLoader worker, its whole life (ms)", "worker_cpu_ms", 1),
        ("loop wall time (s; noisy under load)", "loop_wall_s", 1),
    ):
        cells = ["%.2f (%+.1f %%)" % (s[n][k], 100 * (s[n][k] / b[k] - 1)) for n in traced]
        print("| %s | %.2f | %s |" % (label, b[k], " | ".join(cells)))
