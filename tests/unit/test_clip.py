"""report/clip.py: texts quoted in a verdict paragraph are cut at a phrase or word
boundary, marked with '…', and never leave a bracket or quotation open (the blind job
ray2_queue_producer_raise.py got "... at its last sample (phase 't). Next: ..." and an
unclosed "(cascade, ..." from a plain [:100] cut)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from hangtrace.tracer.diagnosis import Diagnosis  # noqa: E402
from hangtrace.tracer.report.clip import clip  # noqa: E402
from hangtrace.tracer.report.paragraph import verdict_paragraph  # noqa: E402

SIGTERM = (
    "SIGTERM received (faulthandler dump present); not an OOM: RSS 295.3 MiB at its last sample "
    "(phase 'train_step')"
)


def balanced(s):
    depth = {"(": 0, "[": 0, "{": 0}
    for a, b in (("(", ")"), ("[", "]"), ("{", "}")):
        depth[a] = s.count(a) - s.count(b)
    return not any(depth.values())


def test_short_text_is_unchanged():
    assert clip("ValueError: bad (x)", 100) == "ValueError: bad (x)"
    assert clip(None, 10) == ""


@pytest.mark.parametrize("n", range(8, len(SIGTERM) + 1, 3))
def test_cut_is_at_a_boundary_balanced_and_marked(n):
    out = clip(SIGTERM, n)
    assert len(out) <= n + 2 and balanced(out) and out.endswith(("…", "…)")), out
    body = out.rstrip(")").rstrip("…")
    assert SIGTERM.startswith(body) and SIGTERM[len(body)] in " ;,:", out  # never inside a word
    assert "'t" not in out and out.count("'") % 2 == 0


def test_prefers_a_phrase_boundary_and_drops_an_unfinished_parenthesis():
    assert clip(SIGTERM, 100) == "SIGTERM received (faulthandler dump present); not an OOM…"
    assert clip("a (b c d e f g h i j k l m n o p q r s t u v w x y z)", 20) == "a (b c d e f g h i…)"


def test_cascade_paragraph_of_a_rankless_actor_is_well_formed():
    """The paragraph of the blind run: the cascade text cut to 100 characters."""
    d = Diagnosis(
        kind="dead-rank",
        cause="exception",
        culprit_actors=["Rollout 'rollout'"],
        details={
            "cause_text": "RuntimeError: probability tensor contains either `inf`, `nan` or element < 0"
        },
        cascade=[{"rank": -1, "actor": "Trainer 'trainer'", "cause": "sigterm", "text": SIGTERM}] * 3,
    )
    p = verdict_paragraph(d)
    assert (
        "3 later failure(s) (cascade, e.g. Trainer 'trainer': SIGTERM received (faulthandler dump present); "
        "not an OOM…)." in p
    ), p
    assert balanced(p) and "(phase 't" not in p
