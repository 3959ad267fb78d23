"""benchmarks/bench_straggler.py (issue 43's cost at 4,096 ranks) at a small scale, so that the
benchmark keeps running as the code under it changes: it crashed on main for a whole
session (``bench_scale.template`` was removed in 230c843 and nothing ran the benchmark).
The figures are not asserted (benchmarks/README.md holds them); what is asserted is that it
runs, writes the rings it says, and that the pass names the rank it made slow, with the
added wait it injected and a first slow step inside the change it made."""

import io
import os
import re
import sys
from contextlib import redirect_stdout

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "benchmarks"))

import bench_straggler  # noqa: E402


def test_bench_straggler_runs_and_names_the_rank_it_slowed(tmp_path):
    out = io.StringIO()
    with redirect_stdout(out):
        rc = bench_straggler.main(
            ["--ranks", "12", "--records", "600", "--slow", "7", "--repeats", "1", "--dir", str(tmp_path)]
        )
    assert rc == 0
    assert len([f for f in os.listdir(tmp_path) if f.startswith("ring-")]) == 12
    row = out.getvalue().strip().splitlines()[-1]
    assert row.startswith("| 12 x 600 |"), out.getvalue()
    m = re.search(r"rank (\d+), \+([\d.]+) ms/step, since step (\d+)", row)
    assert m, row
    # 30 ms on each of 10 collectives per step (module docstring); its newest 300 of ~540
    # collectives are slow: the change at step ~24 of ~54
    assert int(m.group(1)) == 7 and 250 < float(m.group(2)) < 320, row
    assert 20 <= int(m.group(3)) <= 28, row
