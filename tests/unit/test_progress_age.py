"""The last progress of a run is its newest progress (collective, p2p, step, phase, group,
the header's progress stamp), not its newest record: the memory sampler writes a sample
every second, which made every rank look as if it had progressed a second before the
snapshot (a live ``hangtrace dump`` of a hung job then read 'Progressing'). Synthetic
snapshots (tests/unit/synth.py); the real-ring path is the same summary (test_summary)."""

from synth import MS, S, T0, R, snap
from hangtrace.tracer.analyze.context import Ctx
from hangtrace.tracer.analyze.diagnose import diagnose


def _mem_sample(b: R, t: int) -> None:
    b.idx += 1
    b.records.append(
        {
            "idx": b.idx,
            "kind": "memory",
            "op": "timer",
            "group": "host",
            "seq": 0,
            "dtype": "",
            "numel": 0,
            "shape": None,
            "peer": -1,
            "async_op": False,
            "batch": False,
            "thread": "hangtrace-memory",
            "phase": b.phase,
            "step": b.step,
            "t_mono_ns": t - T0,
            "t_wall_ns": t,
            "t_end_mono_ns": t - T0,
            "state": "completed",
            "error": None,
            "a": (1 << 30, 0, -1, 0, -1),
        }
    )


def _blocked_outside(taken: int, samples: bool) -> list:
    """Two ranks that stopped progressing at about T0 + 5 ms (both outside collectives),
    with (or without) memory samples every second until just before ``taken``."""
    out = []
    for r in range(2):
        b = R(r, 2)
        b.coll("0", n=3)
        if samples:
            t = b.t + S
            while t < taken - 100 * MS:
                _mem_sample(b, t)
                t += S
        out.append(b.set(progress_wall_ns=b.t))
    return out


def test_memory_samples_are_not_progress():
    taken = T0 + 60 * S
    ctx = Ctx(snap(_blocked_outside(taken, True), reason="request", taken=taken), None, 30.0)
    assert 59.0 < ctx.age_s < 60.1, ctx.age_s
    assert ctx.stalled  # 60 s without progress, threshold 30 s


def test_dump_of_a_hung_job_is_not_progressing():
    taken = T0 + 60 * S
    with_samples = diagnose(snap(_blocked_outside(taken, True), reason="request", taken=taken), stall_s=30.0)
    without = diagnose(snap(_blocked_outside(taken, False), reason="request", taken=taken), stall_s=30.0)
    assert with_samples.kind == without.kind != "progressing", (with_samples.kind, without.kind)


def test_a_rank_that_never_progressed_counts_from_its_start():
    taken = T0 + 40 * S
    procs = []
    for r in range(2):
        b = R(r, 2)
        _mem_sample(b, T0 + S)
        _mem_sample(b, T0 + 39 * S)
        procs.append(b.set(progress_wall_ns=0))
    ctx = Ctx(snap(procs, reason="request", taken=taken), None, 30.0)
    assert ctx.age_s is not None and 39.9 < ctx.age_s <= 40.0, ctx.age_s
