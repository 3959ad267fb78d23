"""Cost of torch's Flight Recorder per gloo all_reduce: on (2000 entries) vs off (0).

World size 1 gloo group, 1-float all_reduce, in fresh processes alternating on/off
(``TORCH_FR_BUFFER_SIZE`` is read when the recorder is created, so it cannot be toggled
in one process). Each process times ``N`` calls after a warm-up and prints the median of
``R`` batches in ns per call. Side by side, same machine, same run; untraced (no hangtrace).

    PYTHONPATH=. python benchmarks/bench_fr.py [pairs]
"""

import os
import statistics
import subprocess
import sys

CHILD = r"""
import os, socket, time, statistics, torch, torch.distributed as dist
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=0, world_size=1)
t = torch.ones(1)
for _ in range(2000):
    dist.all_reduce(t)
meds = []
for _ in range(15):
    t0 = time.perf_counter_ns()
    for _ in range(2000):
        dist.all_reduce(t)
    meds.append((time.perf_counter_ns() - t0) / 2000)
import pickle
n = len(pickle.loads(torch._C._distributed_c10d._dump_fr_trace(True, False, False)).get("entries", []))
print(statistics.median(meds), n)
dist.destroy_process_group()
"""


def run(size: str) -> tuple:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HANGTRACE")}
    env["TORCH_FR_BUFFER_SIZE"] = size
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True)
    ns, n = out.stdout.split()
    return float(ns), int(n)


def main() -> None:
    pairs = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    on, off, entries = [], [], set()
    for _ in range(pairs):
        a, n_on = run("2000")
        b, n_off = run("0")
        on.append(a)
        off.append(b)
        entries.add((n_on, n_off))
    print("gloo all_reduce, world size 1, ns per call (median of process medians, %d pairs)" % pairs)
    print("  Flight Recorder on (2000): %8.0f   entries kept %s" % (statistics.median(on), sorted(entries)))
    print("  Flight Recorder off (0):   %8.0f" % statistics.median(off))
    print(
        "  added by the Flight Recorder: %+.0f ns (%+.1f %%); per pair: %s"
        % (
            statistics.median(on) - statistics.median(off),
            100 * (statistics.median(on) / statistics.median(off) - 1),
            ", ".join("%+.0f" % (a - b) for a, b in zip(on, off)),
        )
    )


if __name__ == "__main__":
    main()
