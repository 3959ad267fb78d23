"""Periodic phases that coincide on the step a rank ran out of memory (analyze/memory/coincide.py).

Blind helper 99 (2026-12-04): validation every 25 steps, a checkpoint every 15, a Ray trainer
OOM-killed by its memory cgroup at step 75, the first step with both; the advice named
validation's memory alone."""

from hangtrace.tracer.analyze.memory.coincide import coinciding


def _rows(last, every=(("validate", 25), ("checkpoint", 15))):
    """Ledger rows (step, phase) of steps 1..``last``: 'train' every step, then each periodic phase on its steps."""
    rows = []
    for s in range(1, last + 1):
        rows.append({"step": s, "phase": "train"})
        rows += [{"step": s, "phase": ph} for ph, n in every if s % n == 0]
    return rows


def test_the_first_step_where_validation_and_checkpoint_coincide_is_named_with_their_periods():
    text = coinciding(_rows(75), 75, 1)
    assert text == (
        "step 75 is the first step on which 'validate' (every 25 steps) and 'checkpoint' (every 15 "
        "steps) both ran, and rank 1 ran out of memory in it: free what 'validate' holds before "
        "'checkpoint' starts, or schedule them on different steps"
    ), text


def test_a_later_coincidence_names_the_first_one_too():
    assert "step 150 is a step on which" in coinciding(_rows(150), 150, 0)
    assert "(as on step 75)" in coinciding(_rows(150), 150, 0)


def test_one_periodic_phase_or_a_step_without_both_is_no_coincidence():
    assert coinciding(_rows(50, every=(("validate", 25),)), 50, 1) is None
    assert coinciding(_rows(60), 60, 1) is None  # (checkpoint alone on step 60)
    assert coinciding(_rows(75), None, 1) is None
