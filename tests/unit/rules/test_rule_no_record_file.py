"""Rule no_record_file: only ranks without a record file are waited for (unknown / no-record-file)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ruleutil import check  # noqa: E402
from synth import ranks, snap  # noqa: E402

from hangtrace.tracer.analyze.diagnose import diagnose  # noqa: E402


def test_culprit_without_file_is_unknown_but_named():
    b = ranks(4)
    for r in (0, 1, 2):
        b[r].wait()
    procs = [x.build() for x in b[:3]]
    d = check(diagnose(snap(procs)), "unknown", [3])
    assert d.cause == "no-record-file"
