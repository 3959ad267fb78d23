"""Freeze a stored snapshot folder of a real run as a golden input (offline, deterministic).

    PYTHONPATH=. python tests/unit/golden/examples/freeze.py RUN/snapshots/<time> example_<fault>

writes ``tests/unit/golden/examples/example_<fault>.in.json.gz``: the ``Snapshot`` that
``collect.rings.load_snapshot`` reads from the folder (rings decoded, stacks, signals,
processes.json), as JSON, with the call the watcher makes (``diagnose(snap)``). Then
``HANGTRACE_REGEN_GOLDEN=1 python -m pytest tests/unit/test_golden.py`` writes its
expected output with the current analysis (review the diff).
"""

import gzip
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from capture import snapshot_to_json  # noqa: E402

from hangtrace.tracer.collect.rings import load_snapshot  # noqa: E402


def main(argv: list) -> int:
    snap_dir, name = argv[1], argv[2]
    snap = load_snapshot(snap_dir)
    snap.path = None  # the folder is not part of the frozen input
    snap.run_dir = "/run/%s" % name
    data = json.dumps(
        [{"call": {"now_wall_ns": None, "stall_s": None}, "snapshot": snapshot_to_json(snap)}],
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    with open(os.path.join(HERE, name + ".in.json.gz"), "wb") as f:
        f.write(gzip.compress(data, mtime=0))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
