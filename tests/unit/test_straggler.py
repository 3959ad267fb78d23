"""The straggler analysis (issue 43, analyze/straggler/): on rings recorded by a real traced
4-rank gloo job (tests/unit/data/straggler/: rank 2's compute 4x slower from step 20, and a
job where every rank sleeps a random 0-20 ms per step), and on synthetic records for the
edges (noise, tiny jitter, two ranks, no steps, Flight Recorder entries, a change point)."""

import glob
import gzip
import os
import random

import pytest

from hangtrace.tracer.analyze.diagnose import diagnose
from hangtrace.tracer.analyze.straggler import detect, find, of_processes
from hangtrace.tracer.collect.rings import load_run
from hangtrace.tracer.report.stragglertext import straggler_phrase
from hangtrace.tracer.report.timeline.model import assign_tracks
from hangtrace.tracer.snapshot import ProcessInfo, Snapshot
from hangtrace.tracer.watch.stragglerwatch import StragglerWatch

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "straggler")
T0 = 1_700_000_000_000_000_000
MS = 1_000_000


def recorded(tmp_path, name):
    """The recorded run ``name`` unpacked into a run directory; its Snapshot."""
    d = tmp_path / name
    d.mkdir()
    for gz in glob.glob(os.path.join(DATA, name, "*.htr.gz")):
        with gzip.open(gz, "rb") as f:
            (d / os.path.basename(gz)[:-3]).write_bytes(f.read())
    return load_run(str(d))


def test_recorded_rings_name_rank_2_its_margin_phase_and_first_slow_step(tmp_path):
    snap = recorded(tmp_path, "slow")
    st = of_processes({p.rank: p for p in snap.processes})
    assert st is not None
    assert (st.rank, st.group, st.phase, st.since_step) == (2, "0", "train", 20)
    assert st.added_ms_per_step > 20 and st.added_pct is not None and st.added_pct > 20
    assert st.margin_ms > st.threshold_ms >= detect.FLOOR_MS
    assert st.last_steps >= 0.8 * st.window_steps


def test_recorded_rings_of_uniform_noise_name_nobody(tmp_path):
    snap = recorded(tmp_path, "noise")
    assert of_processes({p.rank: p for p in snap.processes}) is None


def test_recorded_rings_diagnosis_details_and_paragraph(tmp_path):
    snap = recorded(tmp_path, "slow")
    newest = max(r["t_wall_ns"] for p in snap.processes for r in p.summary.history)
    d = diagnose(snap, now_wall_ns=newest + 1_000 * MS)
    assert d.kind == "progressing"
    st = d.details["straggler"]
    assert {
        "rank",
        "group",
        "added_ms_per_step",
        "added_pct",
        "phase",
        "since_step",
        "collectives",
        "window_steps",
    } <= set(st)
    assert st["rank"] == 2 and isinstance(st["collectives"], int) and st["collectives"] > 0
    assert d.summary.startswith("Progressing; rank 2 is slow: +"), d.summary
    assert "in phase 'train', since step 20." in d.summary
    assert d.culprit_ranks == []  # a straggler is no verdict
    noise = diagnose(recorded(tmp_path, "noise"), now_wall_ns=newest + 1_000 * MS)
    assert "straggler" not in noise.details


def test_numpy_and_python_summaries_keep_the_same_history(tmp_path):
    from hangtrace.tracer.collect.rings import load_run as lr

    fast = {p.rank: p for p in recorded(tmp_path, "slow").processes}
    full = {p.rank: p for p in lr(str(tmp_path / "slow"), records=True).processes}
    for r, p in fast.items():
        q = ProcessInfo(host=p.host, pid=p.pid, rank=r, records=full[r].records)
        assert list(p.summary.history) == list(q.summary.history)
    assert of_processes(fast) == of_processes(
        {r: ProcessInfo(host="h", pid=r + 1, rank=r, records=p.records) for r, p in full.items()}
    )


def test_rows_read_in_two_parts_equal_one_read_raw_slots_and_records(tmp_path):
    """The pass reads its newest rows, then (a group with many collectives per step) older
    ones without unpacking the newest twice: the same rows, the same instances as one read."""
    from hangtrace.tracer.analyze.straggler.series import by_group, collective_rows, instances, more_rows
    from hangtrace.tracer.ring.timingrows import rows

    raw = {p.rank: p.summary.history for p in recorded(tmp_path, "long").processes}
    dicts = job(4, 200, slow_from(2, 20, 30))
    for hist in (raw, dicts):
        for h in hist.values():
            assert rows(h, ("collective",), 300, skip=50) == rows(h, ("collective",), 300)[50:]
            assert rows(h, (), 0, skip=7) == rows(h)[7:]
        for first in (10, 192, 600):
            have = collective_rows(hist, first)
            assert more_rows(hist, have, 512) == collective_rows(hist, 512)
        members = by_group(collective_rows(hist, 512))["0"]
        inst = instances("0", members, window=256)
        for i, s in enumerate(inst.seqs):
            walls = [members[r][s].t_wall_ns for r in inst.ranks]
            assert inst.arrival[i] == tuple(float(w - min(walls)) for w in walls)
            assert inst.wall[i] == max(walls) and inst.by_rank[i] == tuple(members[r][s] for r in inst.ranks)


# --- synthetic records: one collective per step in phase 'train', times in ns ---------------
def job(n, steps, late_ms, fr=False, with_steps=True, seed=0):
    """``n`` ranks; ``late_ms(rank, step, rng)`` ms after the step start each issues its all_reduce."""
    rng = random.Random(seed)
    recs = {r: [] for r in range(n)}
    for k in range(steps):
        t = T0 + k * 100 * MS
        issue = {r: t + int(late_ms(r, k, rng) * MS) for r in range(n)}
        end = max(issue.values()) + MS
        for r in range(n):
            st = k if with_steps else None
            out = recs[r]
            base = dict(group=None, seq=0, step=st, state="completed", t_end_mono_ns=None)
            if with_steps:
                out.append(dict(base, kind="step", t_wall_ns=t, t_mono_ns=t - T0 + 1))
            out.append(dict(base, kind="phase_enter", phase="train", t_wall_ns=t, t_mono_ns=t - T0 + 1))
            c = dict(
                base,
                kind="collective",
                op="all_reduce",
                group="0",
                seq=k + 1,
                phase="train",
                t_wall_ns=issue[r],
                t_mono_ns=0 if fr else issue[r] - T0 + 1,
                t_end_mono_ns=None if fr else end - T0 + 1,
            )
            if fr:
                c["source"] = "flight-recorder"
            out.append(c)
            out.append(dict(base, kind="phase_exit", phase="train", t_wall_ns=end, t_mono_ns=end - T0 + 1))
    for r, rs in recs.items():
        for i, x in enumerate(rs):
            x["idx"] = i + 1
    return {r: tuple(rs) for r, rs in recs.items()}


def slow_from(rank, step, ms):
    return lambda r, k, rng: 10 + rng.uniform(0, 1) + (ms if r == rank and k >= step else 0)


def test_synthetic_slow_rank_since_step_and_added_wait():
    st = find(job(8, 60, slow_from(5, 25, 30)))
    assert st is not None and (st.rank, st.since_step, st.phase) == (5, 25, "train")
    assert 25 < st.added_ms_per_step < 35 and 20 < st.added_pct < 40


@pytest.mark.parametrize("seed", range(20))
def test_uniform_noise_names_nobody(seed):
    assert find(job(4, 60, lambda r, k, rng: rng.uniform(0, 20), seed=seed)) is None
    assert find(job(2, 60, lambda r, k, rng: rng.uniform(0, 20), seed=seed)) is None


def test_tiny_systematic_lateness_is_below_the_floors():
    # rank 1 always 2 ms late: last every step, above the others' noise, below 5 ms
    assert find(job(4, 60, lambda r, k, rng: rng.uniform(0, 0.2) + (2 if r == 1 else 0))) is None


def test_two_ranks_and_no_step_numbers_and_flight_recorder_entries():
    st = find(job(2, 60, slow_from(1, 0, 30)))
    assert st is not None and st.rank == 1 and st.since_step == 0  # slow from the group's first collective
    st = find(job(4, 60, slow_from(3, 30, 30), with_steps=False))
    assert st is not None and st.rank == 3 and st.since_step is None and st.window_steps == 32
    st = find(job(4, 60, slow_from(0, 30, 30), fr=True))
    assert st is not None and (st.rank, st.since_step) == (0, 30)


def test_slow_before_the_window_is_said_so():
    full = job(4, 200, slow_from(2, 5, 30))
    st = find({r: h[-400:] for r, h in full.items()})  # steps 100-199 kept: slow in all of them
    assert st is not None and st.rank == 2 and st.since_step is None and st.oldest_step is not None
    assert "since before step %d" % st.oldest_step in straggler_phrase(st.details())


def test_phrase_matches_the_interface():
    st = {"rank": 2, "added_ms_per_step": 30.2, "added_pct": 75.4, "phase": "train", "since_step": 20}
    assert straggler_phrase(st) == "rank 2 is slow: +30 ms per step (+75 %), in phase 'train', since step 20"


def test_hang_verdict_is_not_changed_by_a_straggler():
    recs = job(4, 40, slow_from(2, 10, 30))
    procs = [
        ProcessInfo(host="h", pid=r + 1, rank=r, world_size=4, state="alive", records=list(rs))
        for r, rs in recs.items()
    ]
    # rank 0 blocked in one more all_reduce nobody else issued: a hang about rank 1-3
    extra = dict(procs[0].records[-2], seq=41, state="issued", idx=10_000, t_wall_ns=T0 + 41 * 100 * MS)
    procs[0] = ProcessInfo(
        host="h", pid=1, rank=0, world_size=4, state="alive", records=list(recs[0]) + [extra]
    )
    d = diagnose(
        Snapshot(run_dir="/x", processes=procs, reason="stall"), now_wall_ns=T0 + 2000 * 100 * MS, stall_s=1
    )
    assert d.kind != "progressing"
    assert d.details["straggler"]["rank"] == 2
    assert not d.summary.startswith("Progressing")


def test_watcher_lines_once_at_start_once_at_end():
    lines = []
    w = StragglerWatch(lines.append, clock=lambda: 0.0)
    st = {
        "rank": 2,
        "group": "0",
        "added_ms_per_step": 30.0,
        "added_pct": 75.0,
        "phase": "train",
        "since_step": 20,
    }
    for _ in range(5):
        w._note(dict(st))
    assert len(lines) == 1 and lines[0].startswith("straggler: rank 2 is slow: +30 ms per step (+75 %)")
    w._note(None)  # one check without it: not ended yet
    w._note(dict(st))
    w._note(None)
    w._note(None)
    w._note(None)
    assert len(lines) == 2 and lines[1].startswith("straggler ended: rank 2")
    w.close("the job ended")
    assert len(lines) == 2


def test_timeline_marks_the_straggler_track():
    procs = [ProcessInfo(host="h", pid=r + 1, rank=r) for r in range(3)]
    tracks, _ = assign_tracks(procs, (), (), straggler=1)
    assert [t.name.endswith(" · straggler") for t in tracks] == [False, True, False]
    assert tracks[1].labels == ("straggler",)


def two_per_iteration(n, steps, late_ms):
    """:func:`job` without step numbers, each iteration's all_reduce (64 values) followed by a
    flag all_reduce (1 value) all ranks issue at once, after the slow one."""
    out = {}
    for r, rs in job(n, steps, late_ms, with_steps=False).items():
        recs = []
        for x in rs:
            recs.append(dict(x, numel=64) if x["kind"] == "collective" else x)
            if x["kind"] == "collective":
                k = x["seq"]
                t = T0 + (k - 1) * 100 * MS + 60 * MS + r * 10_000  # all at once, after the slow one
                recs.append(dict(x, seq=0, numel=1, t_wall_ns=t, t_mono_ns=t - T0 + 1, t_end_mono_ns=None))
        seq = 0
        for i, x in enumerate(recs):
            x["idx"] = i + 1
            if x["kind"] == "collective":
                seq += 1
                x["seq"] = seq
        out[r] = tuple(recs)
    return out


def test_no_step_numbers_two_collectives_per_iteration_by_the_stream_period():
    """A loop with no tracer.step that issues a training all_reduce (the straggler is late to
    it) then a flag all_reduce (nobody waits): judged per iteration, the stream's period."""
    assert detect.period([("all_reduce", 64), ("all_reduce", 1)] * 10) == 2
    st = find(two_per_iteration(4, 60, slow_from(1, 0, 30)))
    assert st is not None and st.rank == 1 and st.last_steps == st.window_steps == 32
    assert 95 < st.step_ms < 105 and 25 < st.added_pct < 35  # per iteration, not per collective


def test_a_rank_slow_for_the_newest_ten_steps_only_is_named_and_heavy_tailed_noise_is_not():
    st = find(job(4, 60, slow_from(2, 50, 30)))
    assert st is not None and (st.rank, st.since_step, st.window_steps) == (2, 50, 16)
    for seed in range(30):  # exponential arrivals (mean 10 ms): a heavy tail, nobody slow
        assert find(job(8, 60, lambda r, k, rng: rng.expovariate(0.1), seed=seed)) is None


def test_a_finished_runs_teardown_barrier_keeps_the_stream_period():
    # blind job mp_slow_from_start: 6 all-reduces per step (no step numbers), then a barrier
    # before destroy_process_group; the barrier broke the period and nobody was named
    sizes = [12288, 384, 147456, 384, 384, 1]
    keys = [("all_reduce", n) for n in sizes] * 12
    assert detect.period_tail(keys + [("barrier", 0)]) == (6, 1)
    assert detect.period_tail(keys) == (6, 0)
    assert detect.period_tail([("all_reduce", 1)] * 40 + [("barrier", 0)]) == (1, 0)
    recs = two_per_iteration(4, 60, slow_from(1, 0, 30))
    ended = {}
    for r, rs in recs.items():
        t = rs[-1]["t_wall_ns"] + MS
        bar = dict(rs[-1], op="barrier", numel=0, seq=rs[-1]["seq"] + 1, idx=rs[-1]["idx"] + 1, t_wall_ns=t)
        ended[r] = rs + (bar,)
    st = find(ended)
    assert st is not None and st.rank == 1 and st.last_steps == st.window_steps == 32
    assert 95 < st.step_ms < 105 and 25 < st.added_pct < 35  # per iteration, as without the barrier


def test_an_overwhelming_order_needs_one_standard_deviation_of_the_others_noise():
    """Blind job tr_rank0_histograms: the two other ranks' DDP buckets arrive up to 70 ms apart
    (their noise ~37 ms) while rank 0 is last in 17 of 18 steps, a median 45 ms after them:
    3 x the noise named nobody. Last in 3/4 of the steps beyond a 1e-6 chance level: 1 x."""
    late = lambda r, k, rng: rng.uniform(0, 70) + (45 if r == 0 and k >= 20 else 0)  # noqa: E731
    for seed in range(10):
        st = find(job(3, 60, late, seed=seed))
        assert st is not None and st.rank == 0 and st.threshold_ms < 3 * st.noise_ms, seed
    for seed in range(50):  # the same noise with nobody late: nobody, however noisy
        for n in (3, 4, 8):
            assert find(job(n, 60, lambda r, k, rng: rng.uniform(0, 70), seed=seed)) is None
            assert find(job(n, 60, lambda r, k, rng: rng.expovariate(0.05), seed=seed)) is None


def test_an_all_reduce_per_parameter_is_judged_over_32_steps_not_16():
    """Blind job mp_slow_from_start: 6 all-reduces per step (one per parameter, no step
    numbers); the newest 96 seqs were 16 steps, where a 2-rank group needs 15 of 16."""
    sizes = [12288, 384, 147456, 384, 384, 1]
    out = {}
    for r, rs in job(2, 60, slow_from(1, 0, 30), with_steps=False).items():
        recs, seq = [], 0
        for x in rs:
            if x["kind"] != "collective":
                recs.append(x)
                continue
            for i, n in enumerate(sizes):  # the first waits for the slow rank, the rest at once
                seq += 1
                t = x["t_wall_ns"] if i == 0 else T0 + (x["seq"] - 1) * 100 * MS + 50 * MS + i * MS + r * 1000
                recs.append(dict(x, seq=seq, numel=n, t_wall_ns=t, t_mono_ns=t - T0 + 1))
        out[r] = tuple(dict(x, idx=i + 1) for i, x in enumerate(recs))
    st = find(out)
    assert st is not None and st.rank == 1 and st.window_steps == 32 and st.window_collectives >= 192
