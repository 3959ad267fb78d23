"""Cost of memory sampling (issue 5), side by side in one run: sampling on vs off.

Two measurements, both inside one traced process (``HANGTRACE=1``, a temporary run
directory, ``HANGTRACE_AUTO_WATCH=0``; the script re-executes itself so that the .pth
bootstrap activates tracing exactly as in a job):

1. **Per sample**: ``Sampler.sample()`` called in a tight loop (host figures: statm,
   cgroup usage, oom counter; then host + one ``tracer.gauge``): microseconds per call.
2. **Training loop**: the loop of ``examples/mem_faults.py`` (per step: ``tracer.step``,
   phases ``rollout`` / ``train`` / ``validation`` every 2nd step, a 64x64 linear model's
   forward, backward and SGD step on CPU, ``--step-sleep-s`` of simulated compute)
   without torch.distributed. Blocks of ``--block`` steps alternate between sampling on
   (the sampler and its timer thread running) and off (``hooks.memory.stop()``: the
   phase API then writes phase records only), ``--rounds`` times, so drift hits both
   alike. Reported: median step time of each mode and the overhead in percent, for
   ``--step-sleep-s 0`` (the bare loop, a worst case: ~0.1 ms steps) and for the
   example's 0.15 s steps.

Usage::

    python3 benchmarks/bench_memory_sampling.py [--rounds 10] [--block 200] [--out r.json]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def child(a):
    import torch
    from hangtrace import tracer
    from hangtrace.hooks import state
    from hangtrace.hooks.mem import memory

    rt = state.active()
    assert rt is not None, "tracing is not active in the child"
    s = memory.active()
    assert s is not None, "memory sampling is not active"
    res = {}
    # 1. per-sample cost
    for label, gauge in (("host", False), ("host+gauge", True)):
        if gauge:
            pool = [123456789]
            tracer.gauge("bench_pool", lambda: pool[0], limit=1 << 33)
        n = 20000
        best = None
        for _ in range(5):
            t0 = time.perf_counter_ns()
            for _ in range(n):
                s.sample(1)
            dt = (time.perf_counter_ns() - t0) / n / 1000.0
            best = dt if best is None else min(best, dt)
        res["sample_us_" + label] = round(best, 2)
    tracer.gauge("bench_pool", None)
    # 2. the training loop, sampling on / off in alternating blocks
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 64)

    def steps(k, sleep_s, n0):
        out = []
        for n in range(n0, n0 + k):
            t0 = time.perf_counter_ns()
            tracer.step(n)
            with tracer.phase("rollout"):
                y = model(x)
            with tracer.phase("train"):
                opt.zero_grad()
                loss = y.pow(2).mean()
                loss.backward()
                opt.step()
                if sleep_s:
                    time.sleep(sleep_s)
            if n % 2 == 0:
                with tracer.phase("validation"):
                    with torch.no_grad():
                        model(x)
            out.append(time.perf_counter_ns() - t0)
        return out

    for sleep_s, block, rounds in ((0.0, a.block, a.rounds), (a.step_sleep_s, a.sleep_block, a.sleep_rounds)):
        times = {"on": [], "off": []}
        n0 = 1
        steps(block, sleep_s, n0)  # warm up
        for r in range(rounds):
            order = ("on", "off") if r % 2 == 0 else ("off", "on")
            for mode in order:
                if mode == "on":
                    memory.start(rt)
                else:
                    memory.stop()
                n0 += block
                times[mode] += steps(block, sleep_s, n0)
        memory.start(rt)
        on, off = statistics.median(times["on"]), statistics.median(times["off"])
        res["loop_sleep_%g" % sleep_s] = {
            "steps_per_mode": len(times["on"]),
            "median_step_us_on": round(on / 1000, 1),
            "median_step_us_off": round(off / 1000, 1),
            "overhead_pct": round(100.0 * (on - off) / off, 3),
            "samples_per_step": 1 + 2 * 2.5,
        }
    print(json.dumps(res))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--block", type=int, default=200)
    p.add_argument("--step-sleep-s", type=float, default=0.15)
    p.add_argument("--sleep-rounds", type=int, default=4)
    p.add_argument("--sleep-block", type=int, default=10)
    p.add_argument("--out")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        return child(a)
    with tempfile.TemporaryDirectory(prefix="bench-mem-") as d:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HANGTRACE")}
        env.update(HANGTRACE="1", HANGTRACE_DIR=d, HANGTRACE_AUTO_WATCH="0", HANGTRACE_SLOTS="65536")
        argv = [
            sys.executable,
            os.path.abspath(__file__),
            "--child",
            "--rounds",
            str(a.rounds),
            "--block",
            str(a.block),
            "--step-sleep-s",
            str(a.step_sleep_s),
            "--sleep-rounds",
            str(a.sleep_rounds),
            "--sleep-block",
            str(a.sleep_block),
        ]
        t0 = time.time()
        out = subprocess.run(argv, env=env, capture_output=True, text=True)
        if out.returncode != 0:
            sys.stderr.write(out.stderr)
            return out.returncode
    res = json.loads(out.stdout.strip().splitlines()[-1])
    res["wall_s"] = round(time.time() - t0, 1)
    print("| measurement | sampling on | sampling off | overhead |")
    print("|---|---|---|---|")
    print("| one sample, host figures | %.2f us | - | - |" % res["sample_us_host"])
    print("| one sample, host + 1 gauge | %.2f us | - | - |" % res["sample_us_host+gauge"])
    for k in sorted(x for x in res if x.startswith("loop_")):
        v = res[k]
        print(
            "| loop step (%s s sleep), median of %d | %.1f us | %.1f us | %+.3f %% |"
            % (
                k.split("_")[-1],
                v["steps_per_mode"],
                v["median_step_us_on"],
                v["median_step_us_off"],
                v["overhead_pct"],
            )
        )
    bare = res.get("loop_sleep_0")
    if bare:
        added = bare["median_step_us_on"] - bare["median_step_us_off"]
        res["added_us_per_step"] = round(added, 1)
        res["added_pct_of_example_step"] = round(100.0 * added / (a.step_sleep_s * 1e6), 4)
        print(
            "\nsampling adds %.1f us per step (bare loop, on - off); the example's step is %.0f ms: %.3f %% "
            "(target < 1 %%). The %.2f s loop's own on/off difference is sleep jitter."
            % (added, a.step_sleep_s * 1000, res["added_pct_of_example_step"], a.step_sleep_s)
        )
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
