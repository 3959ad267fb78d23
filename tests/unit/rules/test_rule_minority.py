"""Rule minority: the waiting minority diverged while the others moved on (skipped-collective / extra-collective)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ruleutil import check  # noqa: E402
from synth import ranks, snap  # noqa: E402

from hangtrace.tracer.analyze.diagnose import diagnose  # noqa: E402


def test_rank0_extra_collective_others_moved_on_minority_named():
    b = ranks(4)
    b[0].wait(op="barrier")
    for r in (1, 2, 3):
        b[r].set(state="exited", exit_code=0)
    d = check(diagnose(snap(b)), "skipped-collective", [0])
    assert d.cause == "extra-collective"
    assert d.op == "barrier"
