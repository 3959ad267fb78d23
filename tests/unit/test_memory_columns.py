"""The memory summary read from sample columns (analyze/memory/columns.py, colledger.py) gives
what the sample-dict path gives (ledger rows, kept-across flags, trends, level figures):
on rings the Recorder writes, and on randomised record streams with nested and unmatched
phases, several threads, CUDA, gauges, OOM records, unknown figures and limits. Samples
are decoded lazily (ring/memsamples.MemSamples) and compare equal to the eager list."""

import dataclasses
import random

import pytest

from hangtrace.hooks.record.recorder import Recorder
from hangtrace.tracer.analyze.memory import colledger as CL
from hangtrace.tracer.analyze.memory import columns as C
from hangtrace.tracer.analyze.memory.summary import _rank_figures, analyse_process, summarize
from hangtrace.tracer.collect.ringprocs import process_from_ring
from hangtrace.tracer.ring import layout as F
from hangtrace.tracer.ring import reader as RD
from hangtrace.tracer.ring.memsamples import MemSamples, samples
from hangtrace.tracer.snapshot import ProcessInfo

np = pytest.importorskip("numpy")

MIB = 1 << 20
SOURCES = ("timer", "phase_enter", "phase_exit", "step", "oom")


def _both(p: ProcessInfo, rank: int):
    """analyse_process from columns, and from the same samples as a list of dicts."""
    assert C.columns(p.memory) is not None
    fast = analyse_process(p, rank)
    slow = analyse_process(dataclasses.replace(p, memory=samples(list(p.memory.records()))), rank)
    return fast, slow


def _same(fast, slow):
    assert isinstance(fast["rows"], CL.LedgerRows) and isinstance(slow["rows"], list)
    assert list(fast["rows"]) == slow["rows"]
    assert len(fast["rows"]) == len(slow["rows"])
    assert fast["kept"] == slow["kept"]
    assert fast["trends"] == slow["trends"]
    assert _rank_figures(fast) == _rank_figures(slow)


def _record(i, src, what, a, phase=None, step=None, thread="MainThread"):
    return {
        "idx": i,
        "kind": "memory",
        "source": src,
        "what": what,
        "thread": thread,
        "phase": phase,
        "step": step,
        "t_mono_ns": i,
        "t_wall_ns": 10**18 + i * 10**6,
        "a": tuple(a),
    }


def _stream(rng: random.Random, n: int):
    """Records of one process: steps with nested phases on two threads (some exits
    missing, some naming an outer phase, some nobody entered), timer/step/OOM samples,
    host / cuda:0 / gauge samples, -1 figures, limits on and off."""
    recs, step, open_ = [], 0, {"MainThread": [], "loader": []}
    base = rng.choice([300 * MIB, 5 * MIB, 2 << 30])
    for i in range(1, n + 1):
        thread = "MainThread" if rng.random() < 0.8 else "loader"
        st = open_[thread]
        r = rng.random()
        if r < 0.3:
            ph = rng.choice(["train", "eval", "ckpt", "fwd"])
            src = "phase_enter"
            st.append(ph)
        elif r < 0.6:
            src = "phase_exit"
            ph = st.pop() if st and rng.random() < 0.85 else rng.choice(["train", "ckpt", "nobody"])
            if ph in st:
                del st[st.index(ph) :]
        else:
            src, ph = rng.choice(["timer", "timer", "step", "oom"]), (st[-1] if st else None)
        if src == "step" or rng.random() < 0.05:
            step += 1
        base += rng.choice([0, 0, MIB, 9 * MIB, -9 * MIB, 40 * MIB])
        what = rng.choice(["host"] * 6 + ["cuda:0", "gauge:kv"])
        unknown = rng.random() < 0.05
        if what == "host":
            limit = rng.choice([0, 0, -1, 8 << 30])
            a = (
                -1 if unknown else base,
                0,
                base * 3 if rng.random() < 0.9 else -1,
                limit,
                rng.choice([0, 1]),
            )
        elif what == "cuda:0":
            a = (base, base + MIB, -1 if unknown else base * 2, 5 << 30, rng.choice([16 << 30, -1]))
        else:
            a = (-1 if unknown else base // 2, rng.choice([0, 4 << 30]), -1, -1, -1)
        recs.append(_record(i, src, what, a, ph, step if rng.random() < 0.9 else None, thread))
    return recs


@pytest.mark.parametrize("seed", range(40))
def test_columns_match_sample_dicts_on_random_streams(seed):
    rng = random.Random(seed)
    recs = _stream(rng, rng.choice([5, 40, 300]))
    p = ProcessInfo(host="h", pid=1, rank=0, memory=MemSamples(recs, from_ring=seed % 2 == 0))
    _same(*_both(p, 0))


def _simple(nsteps: int, kept_on=(), grow=0):
    """One thread, phases 'train' every step and 'val' on ``kept_on`` steps keeping 64 MiB:
    the enter/exit pairs numpy reads without a walk."""
    recs, i, v = [], 0, 1 << 30
    for st in range(nsteps):
        for ph in ("train", "val") if st in kept_on else ("train",):
            i += 1
            recs.append(_record(i, "phase_enter", "host", (v, 0, v, 16 << 30, 0), ph, st))
            v += (64 * MIB if ph == "val" else 0) + grow
            i += 1
            recs.append(_record(i, "phase_exit", "host", (v, 0, v, 16 << 30, 0), ph, st))
        if st in kept_on:
            v -= 0  # (kept: not given back)
        i += 1
        recs.append(_record(i, "timer", "host", (v, 0, v, 16 << 30, 0), None, st, "hangtrace-memory"))
    i += 1
    recs.append(_record(i, "phase_enter", "host", (v, 0, v, 16 << 30, 0), "train", nsteps))
    return recs


def test_pairs_path_flags_and_trends_match():
    recs = _simple(12, kept_on=(3, 6, 9))
    c = C.columns(MemSamples(recs, from_ring=True))
    assert c is not None and CL._pairs(np, c, c.metrics["rss"].present) is not None
    fast, slow = _both(ProcessInfo(host="h", pid=1, rank=3, memory=MemSamples(recs)), 3)
    assert fast["kept"] and fast["kept"][0]["grown_in"] == "val"
    _same(fast, slow)
    fast, slow = _both(ProcessInfo(host="h", pid=1, rank=3, memory=MemSamples(_simple(9, grow=32 * MIB))), 3)
    assert fast["trends"]["rss"]["steady"]
    _same(fast, slow)


def test_records_the_columns_cannot_read_go_to_the_sample_dicts():
    recs = _simple(5)
    recs[3] = dict(recs[3], a=(1.5e9, 0, 2e9, 0, 0))  # floats: kept as written by samples()
    assert C.columns(MemSamples(recs)) is None
    recs = _simple(5)
    recs[2] = dict(recs[2], step=-3)
    assert C.columns(MemSamples(recs)) is None
    assert C.columns(MemSamples([dict(r, step=2**60 + 1) for r in _simple(3)], from_ring=True)) is None
    p = ProcessInfo(host="h", pid=1, rank=0, memory=MemSamples(recs))
    a = analyse_process(p, 0)
    assert isinstance(a["rows"], list) and a["samples"] == samples(recs)


def test_lazy_samples_equal_the_eager_list():
    recs = _simple(4) + [{"kind": "collective", "idx": 99}]
    ms = MemSamples(recs)
    assert len(ms) == len(recs) - 1 and ms._decoded is None  # (not decoded to count)
    assert ms == samples(recs) and list(ms) == samples(recs) and ms[-1] == samples(recs)[-1]
    assert list(reversed(ms)) == samples(recs)[::-1]
    assert MemSamples([dict(recs[0], a=(1, 2))], from_ring=True) == []  # (undecodable: empty, as before)
    with pytest.raises(ValueError):
        list(MemSamples([dict(recs[0], a=(1, 2))]))  # (not from a ring: the error, as samples() gives)


def test_real_ring_summary_matches(tmp_path):
    """A ring the Recorder wrote: phases, steps, host and CUDA samples, one OOM record."""
    rec = Recorder(str(tmp_path), "run-m", 4096, lambda *a, **k: None)
    try:
        rec.set_rank(1, 0, 2)
        host, cuda = rec.intern("host"), rec.intern("cuda:0")
        v = 1 << 30
        for st in range(20):
            rec.step(st)
            for ph in ("train", "val") if st % 4 == 0 else ("train",):
                rec.phase_enter(ph)
                rec.memory(F.MEM_ENTER, host, v, 0, 2 * v, 8 << 30, 0)
                rec.memory(F.MEM_ENTER, cuda, v // 2, v, v, -1, 16 << 30)
                v += 48 * MIB if ph == "val" else MIB
                rec.memory(F.MEM_TIMER, host, v, 0, 2 * v, 8 << 30, 0)
                rec.memory(F.MEM_EXIT, host, v, 0, 2 * v, 8 << 30, 0)
                rec.memory(F.MEM_EXIT, cuda, v // 2, v, v, -1, 16 << 30)
                rec.phase_exit(ph)
        rec.memory(F.MEM_OOM, cuda, 1 << 30, v // 2, -1, 0, 16 << 30)
        path = rec.path
    finally:
        rec.close()
    p = process_from_ring(RD.read_ring(path, records=False), state="alive")
    assert isinstance(p.memory, MemSamples) and p.memory.from_ring and p.memory._decoded is None
    fast, slow = _both(p, 1)
    _same(fast, slow)
    assert set(fast["trends"]) == {"rss", "cuda:0 allocated", "cuda:0 reserved"}
    assert p.memory._decoded is None  # (the summary read columns only)
    eager = dataclasses.replace(p, memory=list(p.memory))
    assert summarize({1: p}, [1]) == summarize({1: eager}, [1])


@pytest.mark.parametrize("seed", range(40, 60))
def test_flag_prefilter_is_the_dict_rule(seed):
    """colledger._may_flag is exactly ledger's "some step kept and another released" test."""
    from hangtrace.tracer.analyze.memory.ledger import _net_per_step, _steps_of, _thr, kept_threshold

    rng = random.Random(seed)
    recs = _stream(rng, 300) + _simple(12, kept_on=(2, 5, 8))
    c = C.columns(MemSamples(recs))
    for r in CL.ledger_rows(np, c):
        rows = CL._row_dicts(c, r, 0)
        thr = kept_threshold(r.metric.name, _thr([x["enter"] for x in rows] + [x["exit"] for x in rows]))
        net, _seqs = _net_per_step(_steps_of(rows), r.metric.name)
        want = any(n > thr for n in net.values()) and any(abs(n) <= thr for n in net.values())
        assert CL._may_flag(np, c, r) == want
