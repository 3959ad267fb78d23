"""Freeze a stored snapshot folder of a real run as an input of the console goldens.

    PYTHONPATH=. python tests/unit/golden/console/freeze.py RUN/snapshots/<time> <name>

writes ``tests/unit/golden/console/<name>.in.json.gz``: the ``Snapshot`` the pipeline
reads from the folder (``pipeline.load_stored``: rings decoded, stacks, signals, Ray's
tables of a ``-ray`` snapshot), as JSON. Then ``HANGTRACE_REGEN_GOLDEN=1 python -m pytest
tests/unit/test_console_verdict.py`` writes the expected console blocks (review them).
"""

import dataclasses
import gzip
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from capture import snapshot_to_json  # noqa: E402

from hangtrace.tracer.pipeline import load_stored  # noqa: E402


def main(argv: list) -> int:
    snap_dir, name = argv[1], argv[2]
    # the folder is not part of the frozen input
    snap = dataclasses.replace(load_stored(snap_dir), path=None, run_dir="/run/%s" % name)
    data = json.dumps(snapshot_to_json(snap), sort_keys=True, separators=(",", ":")).encode()
    with open(os.path.join(HERE, name + ".in.json.gz"), "wb") as f:
        f.write(gzip.compress(data, mtime=0))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
