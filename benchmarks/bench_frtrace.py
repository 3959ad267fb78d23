"""torch's Flight Recorder analyzer (``torchfrtrace``) vs ``hangtrace analyze`` on the same dumps.

Synthetic dumps of 64, 256 and 1,024 ranks (NCCL-style names and a full ``pg_config``, so
that torch's analyzer can read them): 40 world all_reduces completed everywhere, then every
rank but rank 7 blocked (not retired) in all_reduce 41; rank 7 skipped it. Plus, when given,
a directory of real dumps (``tests/integration/test_fr_live.py`` writes them from a real gloo
job: pass its ``dumps`` folder). Wall time of each command (fresh process, median of 3) and
the first lines of its output, side by side.

    PYTHONPATH=. python benchmarks/bench_frtrace.py [REAL_DUMP_DIR]
"""

import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time

T0 = 1_796_000_000_000_000_000


def entry(seq: int, retired: bool) -> dict:
    return {
        "record_id": seq - 1,
        "pg_id": 0,
        "process_group": ("0", "default_pg"),
        "thread_name": "python",
        "thread_id": "1",
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "op_id": seq,
        "profiling_name": "nccl:all_reduce",
        "time_created_ns": T0 + seq * 1_000_000,
        "input_sizes": [[1024]],
        "input_dtypes": ["Float"],
        "output_sizes": [[1024]],
        "output_dtypes": ["Float"],
        "state": "completed" if retired else "scheduled",
        "time_discovered_started_ns": None,
        "time_discovered_completed_ns": None,
        "retired": retired,
        "timeout_ms": 600000,
        "is_p2p": False,
        "frames": [],
    }


def synth(world: int, d: str) -> None:
    cfg = {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(world)))}}
    for r in range(world):
        es = [entry(s, True) for s in range(1, 41)]
        if r != 7:
            es.append(entry(41, False))
        dump = {
            "version": "2.10",
            "comm_lib_version": "2.21.5",
            "pg_config": cfg,
            "pg_status": {
                "0": {
                    "last_enqueued_collective": len(es),
                    "last_started_collective": len(es),
                    "last_completed_collective": 40,
                }
            },
            "entries": es,
        }
        with open(os.path.join(d, "comm_lib_trace_rank_%d" % r), "wb") as f:
            pickle.dump(dump, f)


def timed(cmd: list) -> tuple:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HANGTRACE")}
    times, out = [], None
    for _ in range(3):
        t0 = time.perf_counter()
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        times.append(time.perf_counter() - t0)
        out = p
    text = (out.stdout + out.stderr).strip().splitlines()
    keep = [ln for ln in text if ln.strip() and "tabulate" not in ln][:4]
    return statistics.median(times), out.returncode, keep


def compare(label: str, d: str) -> None:
    ours = timed([sys.executable, "-m", "hangtrace", "analyze", d])
    theirs = timed(
        [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", d, "-p", "comm_lib_trace_rank_"]
    )
    print("\n## %s" % label)
    print("| tool | s (median of 3) | exit | first lines of output |")
    print("|---|---|---|---|")
    for name, (s, rc, lines) in (("hangtrace analyze", ours), ("torchfrtrace", theirs)):
        print("| %s | %.2f | %d | %s |" % (name, s, rc, " / ".join(ln.strip()[:160] for ln in lines)))
    print("ratio torchfrtrace / hangtrace: %.2f" % (theirs[0] / ours[0]))


def main() -> None:
    for world in (64, 256, 1024):
        with tempfile.TemporaryDirectory() as d:
            synth(world, d)
            compare("synthetic, %d ranks, rank 7 skipped all_reduce 41" % world, d)
    if len(sys.argv) > 1:
        compare("real gloo DDP job, 3 ranks, rank 2 trains one batch more (%s)" % sys.argv[1], sys.argv[1])


if __name__ == "__main__":
    main()
