"""Issue 40: the Flight Recorder join over a window of newest records equals the full join
where the analysis reads it; the indexed pairing equals the linear scan it replaced; gc
takes `hangtrace attach` folders and tidies what runs leave behind."""

import os
import pickle
import random

from hangtrace.tracer.collect.frdump import parse_fr_bytes
from hangtrace.tracer.ring import frrecords
from hangtrace.tracer.ring.frcands import Cands
from hangtrace.tracer.ring.frrecords import fr_records, merge_records
from hangtrace.tracer.ring.summary import summarize_records
from hangtrace.tracer.watch import housekeeping

T0 = 1_700_000_000_000_000_000
MS = 1_000_000


def _entry(seq, t, name="gloo:all_reduce", retired=True):
    return {
        "record_id": seq - 1,
        "pg_id": 0,
        "process_group": ("0", "default_pg"),
        "thread_name": "python",
        "thread_id": "1",
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "op_id": seq,
        "profiling_name": name,
        "time_created_ns": t,
        "input_sizes": [[4]],
        "input_dtypes": ["Float"],
        "output_sizes": [[4]],
        "output_dtypes": ["Float"],
        "state": "scheduled",
        "retired": retired,
        "timeout_ms": 600000,
        "is_p2p": False,
        "frames": [{"name": "step", "filename": "train.py", "line": 7}],
    }


def _job(steps, seed=0):
    """Our records (a Python all_reduce per step, a step record) and the FR dump of the same
    run (a C++-issued all_reduce before each of ours: DDP's), last call still in flight."""
    ours, d = _job_dump(steps, seed)
    return ours, fr_records(d)


def _job_dump(steps, seed=0):
    """:func:`_job` with the dump itself (an ``FrDump``) instead of its records."""
    rnd = random.Random(seed)
    ours, es, idx, seq = [], [], 0, 0
    t = T0
    for s in range(steps):
        t += 10 * MS + rnd.randrange(MS)
        seq += 1
        es.append(_entry(seq, t))  # C++-issued: FR only
        t += 2 * MS
        seq += 1
        last = s == steps - 1
        es.append(_entry(seq, t + 1000, retired=not last))
        idx += 1
        ours.append(
            {
                "idx": idx,
                "kind": "collective",
                "op": "all_reduce",
                "group": "0",
                "seq": s + 1,
                "state": "issued" if last else "completed",
                "t_wall_ns": t,
                "t_mono_ns": t,
                "t_end_mono_ns": None if last else t + MS,
                "async_op": False,
                "phase": "train",
                "step": s,
            }
        )
        if not last:
            idx += 1
            ours.append(
                {"idx": idx, "kind": "step", "step": s + 1, "t_wall_ns": t + MS, "state": "completed"}
            )
    d = parse_fr_bytes(pickle.dumps({"version": "2.10", "entries": es}), "x", rank=0, host="h", pid=1)
    return ours, d


def test_window_join_equals_full_join_where_the_analysis_reads():
    ours, fr = _job(200)
    full = summarize_records(merge_records(ours, fr))
    tail = ours[-40:]
    window = [ours[0]] + tail  # a summary subset (an old single) and the newest records
    part = summarize_records(merge_records(window, fr, since_ns=float(tail[0]["t_wall_ns"])))
    for k in ("last", "last_comm", "inflight", "last_progress"):
        assert getattr(part, k) == getattr(full, k), k
    assert part.by_group == full.by_group
    assert part.tail[-30:] == full.tail[-30:]
    assert part.inflight["seq"] == 400 and part.inflight["seq_ours"] == 200
    # FR entries older than the window that nothing pairs with are left out
    assert len(merge_records(window, fr, since_ns=float(tail[0]["t_wall_ns"]))) < len(merge_records(ours, fr))


def _mixed_dump_entries(steps, seed):
    """The entries of ``_job`` plus what a real dump also holds: NCCL entries, some failed
    (retired before completion), p2p sends, and a group seen only in the oldest entries."""
    rnd = random.Random(seed)
    _ours, fr = _job(steps, seed)
    es = []
    for r in fr:
        e = _entry(r["fr_seq"], r["t_wall_ns"], retired=r["fr_retired"])
        e["record_id"] = r["fr_record_id"]
        es.append(e)
    rid = len(es)
    for i in range(0, len(es), 7):  # NCCL entries on another group, some failed
        e = _entry(
            1000 + i, es[i]["time_created_ns"] + 500, name="nccl:all_gather", retired=rnd.random() < 0.3
        )
        e.update(record_id=rid, process_group=("1", "tp"), state=rnd.choice(["scheduled", "completed"]))
        es.append(e)
        rid += 1
    for i in range(3, len(es) // 2, 11):  # p2p sends to two peers
        e = _entry(0, es[i]["time_created_ns"] + 700, name="nccl:send 0->%d" % (1 + i % 2))
        e.update(record_id=rid, p2p_seq_id=i, is_p2p=True, process_group=("2", "pp"), state="completed")
        es.append(e)
        rid += 1
    old = _entry(1, T0 - 10**9, name="gloo:barrier")
    old.update(record_id=rid, process_group=("9", "only_old"), state="completed")
    es.append(old)
    es.sort(key=lambda e: e["record_id"])
    return es


def test_a_dump_parsed_from_the_windows_cutoff_joins_as_the_whole_dump():
    from types import SimpleNamespace

    from hangtrace.tracer.ring.frjoin import fr_groups, window_cutoff

    for seed in range(6):
        ours, _fr = _job(120, seed)
        tail = ours[-30:]
        old = next(r for r in ours[-80:] if r["kind"] == "collective")  # (one of the summary)
        window = [old] + tail
        # its FR partner missing: it is numbered after the highest seq before it (torch's)
        es = [e for e in _mixed_dump_entries(120, seed) if e["time_created_ns"] != old["t_wall_ns"] + 1000]
        data = pickle.dumps({"version": "2.10", "entries": es})
        p = SimpleNamespace(records=window, summary=SimpleNamespace(tail=tail, history=(), count=len(ours)))
        cutoff = window_cutoff(p)
        assert cutoff is not None and cutoff <= old["t_wall_ns"] - 2 * frrecords.SLACK_NS
        since = float(min(r["t_wall_ns"] for r in tail))
        whole = parse_fr_bytes(data, "x", rank=0, host="h", pid=1)
        part = parse_fr_bytes(data, "x", rank=0, host="h", pid=1, cutoff_ns=cutoff)
        assert len(part.entries) < len(whole.entries) / 2
        assert merge_records(window, fr_records(part), since) == merge_records(
            window, fr_records(whole), since
        )
        assert fr_groups(part) == fr_groups(whole)  # (every group keeps its newest entry)
    every = SimpleNamespace(
        records=ours, summary=SimpleNamespace(tail=ours[-30:], history=(), count=len(ours))
    )
    assert window_cutoff(every) is None  # every record there: every entry may join


def _linear_merge_one(r, cands, used):
    """The pairing as it was before issue 40 (a linear scan per record): the reference."""
    t0, t1 = r.get("t_wall_ns") or 0, frrecords._end_wall(r)
    w0 = t0 - frrecords.SLACK_NS
    near = [e for e in cands if w0 <= e["t_wall_ns"] <= t1 + frrecords.SLACK_NS and id(e) not in used]
    match = next(
        (e for e in near if frrecords._compatible(str(r.get("op")), e["op"])), near[0] if near else None
    )
    if match is None:
        before = [e["seq"] for e in cands if e["t_wall_ns"] < w0]
        return ("unmatched", max(before) if before else None)
    return ("match", match["seq"], len(near))


def test_indexed_pairing_equals_the_linear_scan():
    for seed in range(5):
        ours, fr = _job(60, seed)
        rnd = random.Random(seed)
        rnd.shuffle(fr)  # launch order and time order need not agree
        cands = [e for e in fr if e["kind"] == "collective"]
        idx = Cands(cands)
        for r in ours:
            if r["kind"] != "collective":
                continue
            t0, t1 = r["t_wall_ns"], frrecords._end_wall(r)
            w0 = t0 - frrecords.SLACK_NS
            near = idx.within(w0, t1 + frrecords.SLACK_NS)
            ref = _linear_merge_one(r, cands, set())
            if ref[0] == "match":
                assert len(near) == ref[2]
                assert [e["seq"] for e in near] == [
                    e["seq"] for e in cands if w0 <= e["t_wall_ns"] <= t1 + frrecords.SLACK_NS
                ]
            else:
                assert not near and idx.max_seq_before(w0) == ref[1]


def test_gc_takes_attach_folders_and_tidies_kept_runs(tmp_path):
    att = tmp_path / "hangtrace-attach-20261207T101500-42"
    (att / "stacks").mkdir(parents=True)
    (att / "processes.json").write_text("{}")
    other = tmp_path / "hangtrace-attachments"
    other.mkdir()
    assert housekeeping.find_runs(str(tmp_path), explicit=False) == [str(att)]
    assert housekeeping.is_run_dir(str(att))
    run = tmp_path / "run"
    (run / "stacks").mkdir(parents=True)
    (run / "stacks" / "dump-h-1.txt").write_text("")
    (run / "stacks" / "sigterm-h-2.txt").write_text("Thread 0x1 ...\n")
    (run / "env").mkdir()
    (run / "snapshots" / "x").mkdir(parents=True)
    assert housekeeping.tidy(str(run)) == 4  # one empty file, three empty folders
    assert sorted(os.listdir(run)) == ["stacks"]
    assert os.listdir(run / "stacks") == ["sigterm-h-2.txt"]


def test_snapshot_copy_links_a_finished_ring_and_leaves_unwritten_slots_a_hole(tmp_path):
    from hangtrace.hooks.record.recorder import Recorder
    from hangtrace.tracer.ring import layout as F
    from hangtrace.tracer.ring.reader import read_ring, snapshot_copy

    rec = Recorder(str(tmp_path), "t", 4096, lambda *a: None)
    rec.set_rank(0, 0, 2)
    for n in range(5):
        rec.step(n)
    rec.close()
    src = rec.path
    copy, link = str(tmp_path / "copy.htr"), str(tmp_path / "link.htr")
    written = snapshot_copy(src, copy)
    assert written < F.HEADER_SIZE + 16 * F.SLOT_SIZE + 4096 + 64 * 1024  # not the 512 KiB of slots
    assert os.stat(copy).st_blocks * 512 < 64 * 1024
    a, b = read_ring(src), read_ring(copy)
    assert a.records == b.records and len(a.records) >= 5 and a.header == dict(b.header, **{})
    assert snapshot_copy(src, link, frozen=True) == 0
    assert os.stat(link).st_ino == os.stat(src).st_ino


def test_window_join_keeps_the_summarys_history_for_the_straggler_pass():
    """A process read from its ring summary joins its dump over the summary's history too,
    not only its tail: a phase-rich loop's tail of 256 records (memory samples at each phase)
    held 21 of the 60 steps of the contention test job, and its `dump` named no straggler
    (step 20 gone). The joined history equals the full join's, C++-issued entries included."""
    from hangtrace.tracer.ring.frjoin import join_fr
    from hangtrace.tracer.ring.summary import HISTORY
    from hangtrace.tracer.snapshot import ProcessInfo

    ours, d = _job_dump(300)  # (our history: the newest 512 of 599 records, ~256 steps)
    noisy, idx = [], 0
    for r in ours:  # four memory samples after each record (the phase samples)
        for k in range(5):
            idx += 1
            if k == 0:
                noisy.append(dict(r, idx=idx))
            else:
                noisy.append({"idx": idx, "kind": "memory", "t_wall_ns": r["t_wall_ns"] + k, "rss": 1})
    s = summarize_records(noisy, tail=40)
    assert len(s.history) > len(s.tail)
    p = ProcessInfo(host="h", pid=1, rank=0, records=[noisy[0]], summary=s)  # a summary-read process
    joined = join_fr([p], [d])[0]
    part = summarize_records(joined.records).history
    full = summarize_records(merge_records(noisy, fr_records(d))).history
    assert len(full) == HISTORY and len(part) == len(full)
    assert [(r.get("kind"), r.get("seq"), r.get("t_wall_ns")) for r in part] == [
        (r.get("kind"), r.get("seq"), r.get("t_wall_ns")) for r in full
    ]


def test_the_cutoff_is_made_for_the_process_the_join_pairs_the_dump_with():
    from types import SimpleNamespace

    from hangtrace.tracer.ring.frjoin import _matcher, cutoffs

    ours, _fr = _job(40)
    s = SimpleNamespace(tail=ours[-10:], history=(), count=len(ours))
    # two processes claim rank 1 (a restarted rank's rings): a torch-named dump (no pid) of
    # rank 1 joins the last of them, and its entries are selected by that one's window
    procs = [SimpleNamespace(host="h", pid=p, rank=1, records=ours[:3], summary=s) for p in (7, 8)]
    windows = {}
    cutoffs(procs, windows)("", 0, 1)
    assert list(windows) == [_matcher(procs)("", 0, 1)] == [1]
    assert _matcher(procs)("h", 7, 1) == 0  # by host and pid first


def test_a_raw_tails_window_equals_the_window_of_its_decoded_records(tmp_path):
    """``_window`` of a ring read through its summary (a raw ``LazyRecords`` tail: only the
    tail records the summary and history lack are decoded) equals ``_window`` of the same
    summary with its tail decoded, and a tail with a gap (a torn slot) falls back to that."""
    import dataclasses

    from hangtrace.hooks.record.recorder import Recorder
    from hangtrace.tracer.collect.ringprocs import process_from_ring
    from hangtrace.tracer.ring import frjoin
    from hangtrace.tracer.ring import layout as F
    from hangtrace.tracer.ring.reader import read_ring_summary
    from hangtrace.tracer.ring.slotsummary import LazyRecords

    rec = Recorder(str(tmp_path), "t", 1024, lambda *a: None)
    rec.set_rank(0, 0, 2)
    g, host = rec.intern("0"), rec.intern("host")
    for i in range(1, 400):
        c = rec.issue(F.K_COLL, F.OP_IDS["all_reduce"], g, i, 4, 0, F.DTYPE_IDS["float32"], -1, 0)
        rec.complete(c)
        rec.step(i)
        if i % 3 == 0:
            rec.memory(F.MEM_TIMER, host, 100 * i, 0, 200 * i, 1 << 30, 0)
        if i % 50 == 0:
            rec.phase_enter("ckpt")
            rec.phase_exit("ckpt")
    rec.close()
    p = process_from_ring(read_ring_summary(rec.path), state="exited")
    s = p.summary
    assert isinstance(s.tail, LazyRecords) and len(p.records) < s.count
    decoded = dataclasses.replace(p, summary=dataclasses.replace(s, tail=list(s.tail)))
    assert frjoin._consecutive_from(s.tail) == s.tail[0]["idx"]
    assert frjoin._consecutive_from(decoded.summary.tail) is None
    first = s.tail[0]["idx"]
    assert frjoin._tail_records(s.tail, first, {r["idx"]: r for r in p.records}) == list(s.tail)
    assert frjoin._tail_records(s.tail, first, {}) == list(s.tail)
    got, want = frjoin._window(p), frjoin._window(decoded)
    assert got == want and got[1] is not None and len(got[0]) > len(p.records)
    slot = F.SLOT_SIZE
    torn = LazyRecords(s.tail._raw[:slot] + s.tail._raw[2 * slot :], s.tail._strings)  # one slot gone
    assert frjoin._consecutive_from(torn) is None
    gap = dataclasses.replace(p, summary=dataclasses.replace(s, tail=torn))
    assert frjoin._window(gap) == frjoin._window(
        dataclasses.replace(p, summary=dataclasses.replace(s, tail=list(torn)))
    )


def test_float_bounds_find_the_same_entries_among_int_times():
    """``Cands`` over int launch times compares a float bound as an int: the entries found
    within, and the highest seq before, equal a plain comparison's, for bounds between,
    at and beyond the times (inf: an issued call), and over float times too."""
    rnd = random.Random(3)
    for base, ints in ((T0, True), (1000, True), (1000, False)):  # (small: bounds between ints)
        ts = [base + rnd.randrange(10**4) for _ in range(80)]
        items = [{"t_wall_ns": t if ints else float(t), "seq": i} for i, t in enumerate(ts)]
        c = Cands(items)
        assert c.ints is ints
        bounds = [float(t) + d for t in rnd.sample(ts, 20) for d in (-0.5, 0.0, 0.5, 4096.0)]
        for lo in bounds + [float("-inf")]:
            for hi in rnd.sample(bounds, 5) + [float("inf")]:
                assert c.within(lo, hi) == [e for e in items if lo <= e["t_wall_ns"] <= hi]
            before = [e["seq"] for e in items if e["t_wall_ns"] < lo]
            assert c.max_seq_before(lo) == (max(before) if before else None)
