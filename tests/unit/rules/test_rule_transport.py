"""Rule transport: failed records, nobody dead, nobody hung (transport-error)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ruleutil import check  # noqa: E402
from synth import S, ranks, snap  # noqa: E402

from hangtrace.tracer.analyze.failures.causes import is_transport_error
from hangtrace.tracer.analyze.diagnose import diagnose  # noqa: E402


def test_transport_error_no_dead_rank():
    b = ranks(3)
    for x in b:
        x.t += (3 - x.rank) * S  # rank 2 fails first
        x.coll(state="failed", error="Connection reset by peer")
    d = check(diagnose(snap(b)), "transport-error", [2])
    assert sorted(c["rank"] for c in d.cascade) == [0, 1]
    assert is_transport_error("Timed out waiting 1800000ms for recv operation to complete")
