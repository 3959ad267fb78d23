"""Rule idle: nobody waits for a broken rank (progressing, or unknown when stalled)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ruleutil import check  # noqa: E402
from synth import S, ranks, snap  # noqa: E402

from hangtrace.tracer.analyze.diagnose import diagnose  # noqa: E402


def test_progressing_no_rank_waiting():
    b = ranks(4, steps=10)
    d = check(diagnose(snap(b, reason="request", taken=max(x.t for x in b) + S)), "progressing", [])
    assert d.details["last_progress_age_s"] == pytest.approx(1.0, abs=0.01)

def test_progressing_everybody_inside_collective_recently():
    b = ranks(4)
    for x in b:
        x.wait()
    check(diagnose(snap(b, reason="request", taken=max(x.t for x in b) + 2 * S)), "progressing", [])

def test_stalled_everybody_inside_collective_is_unknown():
    b = ranks(4)
    for x in b:
        x.wait()
    d = check(diagnose(snap(b, reason="stall")), "unknown", [])
    assert d.cause == "stalled-inside-collective"
