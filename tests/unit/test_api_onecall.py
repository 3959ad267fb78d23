"""Issue 13: the phase/step API's one-call path (``api._bind``: the C Ring's ``phase_in``,
``phase_out`` and ``step_to``, memory sample included) writes the records the Python path
writes, and is left for the Python path whenever a sample or a record needs it (gauges,
the deep trace, new sampler figures, a new ring, a phase left by an exception).

A real C recorder at full size and a real memory sampler whose timer thread runs (with an
interval too long to tick during the test)."""

import os
import time

import pytest

from hangtrace.hooks.mem import sampler as HS
from hangtrace.hooks.record import recorder as R
from hangtrace.tracer import api
from hangtrace.tracer.ring import reader as RD

from test_fastrec import HAVE_C, NO_C, Log, normalized

pytestmark = pytest.mark.skipif(not HAVE_C, reason=NO_C)


@pytest.fixture
def traced(tmp_path, monkeypatch):
    """This process traced into a fresh full-size C ring, a running sampler; restored after."""
    monkeypatch.setenv("HANGTRACE_PURE_PYTHON", "0")
    rec = R.Recorder(str(tmp_path), "run", 256, Log())
    assert isinstance(rec, R._FastRecorder) and not rec.full_slots
    s = HS.Sampler(rec, rec.log, 1000.0, str(tmp_path))
    saved = (api._recorder, api._sampler, api._deep, dict(api._gauges))
    api._gauges.clear()
    api._set_deep(None)
    api._set_recorder(rec)
    api._set_sampler(s)
    assert HS._memclock().start_thread(s) and s.thread is not None
    yield rec, s
    s.stop()
    api._set_recorder(saved[0])
    api._set_sampler(saved[1])
    api._set_deep(saved[2])
    api._gauges.clear()
    api._gauges.update(saved[3])
    rec.close()


def script() -> None:
    time.sleep(0.002)  # (older than STEP_SAMPLE_GAP_NS: the first step samples on both paths)
    api.step(1)
    with api.phase("rollout", step=2):
        with api.phase("inner"):
            api.heartbeat()
        api.step(3)  # a sample just now: none for the step
    with pytest.raises(ValueError):
        with api.phase("train"):
            raise ValueError("x")
    with api.phase("train"):
        pass
    api.step(4.0)  # (int() as the Python path does)


def run(rec) -> list:
    script()
    out = normalized(RD.read_ring(rec.path).records)
    for r in out:  # this process's RSS and its cgroup's usage move between the two runs
        if r["kind"] == "memory":
            assert r["a"][0] > 0
            r["a"] = (0, r["a"][1], 0) + tuple(r["a"][3:])
    return out


def test_one_call_path_writes_what_the_python_path_writes(traced, tmp_path, monkeypatch):
    rec, s = traced
    api.step(0)  # through the Python path, which binds
    assert api._fast is rec._fast and api._mem == s._host_args()
    n0 = rec._fast.counter
    onecall = run(rec)
    assert s.last_sample_ns() == rec._fast.mem_last_ns > s.last_ns  # (the step-skip and the tick see it)
    calls = []
    monkeypatch.setattr(api, "_bind", lambda: calls.append(1))
    api._unbind()
    python = run(rec)
    assert calls and api._fast is None
    first, second = onecall[n0:], python[len(onecall) :]
    assert [r["kind"] for r in first] == [r["kind"] for r in second]

    def no_idx(rs: list) -> list:
        return [{k: v for k, v in r.items() if k != "idx"} for r in rs]

    assert no_idx(first) == no_idx(second)
    mem = [r for r in first if r["kind"] == "memory"]
    E, X = "phase_enter", "phase_exit"
    assert [r["source"] for r in mem] == ["step", E, E, X, X, E, X, E, X]  # (steps 3 and 4: beside a sample)
    assert all(r["a"][1] == s.swap and r["a"][3] == s.limit for r in mem)
    h = RD.read_ring(rec.path).header
    assert (h["phase_strid"], h["phase_depth"], h["step"]) == (0, 0, 4)


def test_what_leaves_the_one_call_path(traced, monkeypatch):
    rec, s = traced
    api.step(0)
    assert api._fast is not None
    api.gauge("kv", lambda: 7, limit=10)  # gauges: sampled by the Python path
    assert api._fast is None
    api.step(1)
    assert api._fast is None
    api.gauge("kv", None)
    api.step(2)
    assert api._fast is not None
    monkeypatch.setattr(
        s, "_refresh_slow", lambda: setattr(s, "swap", 8192)
    )  # a new figure: unbound by the tick
    monkeypatch.setattr(s, "_check_cgroup", lambda: None)
    s.tick()
    assert api._fast is None
    api.step(3)
    assert api._mem[5] == 8192
    rec.grow("test")  # (full size already: nothing to do, the Ring stays)
    assert api._fast is rec._fast
    rec._remap(rec.fd, rec.mm, rec.nslots, rec.strtab_off, rec.strtab_reserved)  # a new Ring
    assert api._fast is None
    api.step(4)
    assert api._fast is rec._fast
    s.stop()
    assert api._fast is None
    api.step(5)
    assert api._fast is None  # a stopped sampler: the Python path (which skips its sample)


def test_the_one_call_path_never_raises(traced):
    rec, s = traced
    api.step(0)
    assert api._fast is not None
    os.close(s._statm)  # a sample that cannot read: -1 figures, no error
    s._statm = None
    with api.phase("p"):
        api.step(1)
    rec._fast.release()  # a released ring raises inside: logged, not raised
    with api.phase("q"):
        api.step(2)
    assert any(key and key.startswith("api-") for _, key in rec.log.lines)


def test_a_phase_entered_beside_a_sample_repeats_its_figures(traced, tmp_path):
    """``Ring.phase_in`` with a gap: the entry sample repeats the RSS, usage and oom_kill
    figures of the newest host sample read less than ``gap_ns`` before (no reads; swap and
    limit as given), and reads afresh once that sample is older; a reuse does not make the
    newest sample younger. Crafted statm, usage and oom files whose figures change between
    the calls tell a reuse from a read."""
    rec, s = traced
    ring = rec._fast
    files = {n: tmp_path / n for n in ("statm", "usage", "oom")}

    def put(rss_pages: int, usage: int, kills: int) -> None:
        files["statm"].write_text("1000 %d 0 0 0 0 0\n" % rss_pages)
        files["usage"].write_text("%d\n" % usage)
        files["oom"].write_text("oom_kill_disable 0\nunder_oom 0\noom_kill %d\n" % kills)

    put(50, 7000, 1)
    fds = {n: os.open(str(p), os.O_RDONLY) for n, p in files.items()}
    try:
        mem = (rec.intern("host"), fds["statm"], 4096, fds["usage"], fds["oom"], 11, 22)
        ring.mem_host(1, *mem)  # a timer sample: reads 50 pages
        t_read = ring.mem_last_ns
        put(70, 9000, 2)
        ring.phase_in("a", None, mem, 10**12)  # beside it: the same figures, nothing read
        assert ring.mem_last_ns == t_read
        ring.phase_in("b", None, mem, 0)  # no gap: read
        assert ring.mem_last_ns > t_read
        put(90, 9500, 3)
        time.sleep(0.002)
        ring.phase_in("c", None, mem, 1_000_000)  # the newest read is older than the gap: read
    finally:
        for fd in fds.values():
            os.close(fd)
    got = [(r["source"], r["a"]) for r in RD.read_ring(rec.path).records if r["kind"] == "memory"][-4:]
    assert got == [
        ("timer", (50 * 4096, 11, 7000, 22, 1)),
        ("phase_enter", (50 * 4096, 11, 7000, 22, 1)),
        ("phase_enter", (70 * 4096, 11, 9000, 22, 2)),
        ("phase_enter", (90 * 4096, 11, 9500, 22, 3)),
    ], got
