"""Issue 13: ``tracer.step(n)`` skips its memory sample when another sample is younger than
``api.STEP_SAMPLE_GAP_NS`` (a phase boundary's sample beside it has the same figures), and
takes it otherwise, and always before the sampler's thread started (that sample starts it).
Recording stand-ins for the recorder and the sampler: the API's own rule is under test."""

import pytest

from hangtrace.tracer import api


class _Sampler:
    def __init__(self, last_ns: int, thread: object) -> None:
        self.last_ns = last_ns
        self.thread = thread
        self.sources: list = []

    def sample(self, source: int) -> None:
        self.sources.append(source)
        self.last_ns = api._mono()

    def last_sample_ns(self) -> int:
        return self.last_ns


class _Rec:
    def __init__(self) -> None:
        self.steps: list = []

    def step(self, n: int) -> None:
        self.steps.append(n)


@pytest.fixture
def traced(monkeypatch):
    rec = _Rec()
    monkeypatch.setattr(api, "_recorder", rec)
    return rec


@pytest.mark.parametrize(
    "age_ns, thread, sampled",
    [
        (0, object(), False),  # a sample just now: skipped
        (api.STEP_SAMPLE_GAP_NS // 2, object(), False),
        (api.STEP_SAMPLE_GAP_NS * 2, object(), True),  # older than the gap: taken
        (0, None, True),  # no thread yet: taken (it starts it)
    ],
)
def test_step_sample_skipped_only_beside_a_recent_sample(traced, monkeypatch, age_ns, thread, sampled):
    s = _Sampler(api._mono() - age_ns, thread)
    monkeypatch.setattr(api, "_sampler", s)
    api.step(7)
    assert traced.steps == [7]  # the step itself is always recorded
    assert s.sources == ([4] if sampled else [])


def test_loop_of_phase_then_step_samples_twice_per_step(traced, monkeypatch):
    """``with phase(...)`` then ``step(n)``: enter and exit samples, no step sample."""
    s = _Sampler(0, object())
    monkeypatch.setattr(api, "_sampler", s)

    class _PhaseRec(_Rec):
        def phase_enter(self, name, step=None):
            pass

        def phase_exit(self, name, error=None):
            pass

    monkeypatch.setattr(api, "_recorder", _PhaseRec())
    for n in range(3):
        with api.phase("train"):
            pass
        api.step(n)
    assert s.sources == [2, 3] * 3
