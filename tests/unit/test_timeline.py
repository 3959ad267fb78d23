"""Timeline (issue 11) on synthetic snapshots: tracks, clock alignment, open collectives,
flows, counters, verdict marks, killed ranks, helpers, sampling of large runs."""

import json

import orjson

from hangtrace.tracer.report.timeline import DeepTrace, TimelineOptions, build_timeline
from hangtrace.tracer.snapshot import ProcessInfo, Snapshot

WALL0 = 1_800_000_000_000_000_000
MS = 1_000_000
S = 1_000_000_000


def rec(
    idx,
    kind,
    mono,
    op="",
    group=None,
    seq=0,
    end=None,
    state="completed",
    thread="MainThread",
    phase=None,
    step=None,
    peer=-1,
    async_op=False,
    a=(0, 0, 0, 0, 0),
    wall_offset=0,
):
    return {
        "idx": idx,
        "kind": kind,
        "op": op,
        "group": group,
        "seq": seq,
        "dtype": "float32",
        "numel": 1,
        "shape": None,
        "peer": peer,
        "async_op": async_op,
        "batch": False,
        "thread": thread,
        "phase": phase,
        "step": step,
        "t_mono_ns": mono,
        "t_wall_ns": mono + wall_offset,
        "t_end_mono_ns": end if state != "issued" else None,
        "state": state,
        "error": None,
        "a": a,
    }


class Proc:
    """Records of one process on a host whose CLOCK_MONOTONIC is ``wall - offset``."""

    def __init__(
        self, rank, host="h0", pid=None, offset=WALL0 - 100 * S, state="alive", meta=None, ppid=1, groups=None
    ):
        self.rank, self.host, self.pid, self.offset = rank, host, pid or 1000 + rank, offset
        self.records, self.idx, self.state, self.meta, self.ppid = [], 0, state, dict(meta or {}), ppid
        self.groups = (
            groups
            if groups is not None
            else [
                {"name": "0", "desc": "default_pg", "ranks": [0, 1]},
                {"name": "1", "desc": "cp0", "ranks": [0, 1]},
            ]
        )

    def mono(self, wall_rel_ns):
        return WALL0 + wall_rel_ns - self.offset

    def add(self, kind, t_rel, **kw):
        self.idx += 1
        if "end_rel" in kw:
            e = kw.pop("end_rel")
            kw["end"] = self.mono(e) if e is not None else None
        r = rec(self.idx, kind, self.mono(t_rel), wall_offset=self.offset, **kw)
        if kind == "memory":  # as the ring decoder gives them (tracer/ring/records.py): no state
            del r["state"]
        self.records.append(r)
        return self

    def build(self):
        return ProcessInfo(
            host=self.host,
            pid=self.pid,
            rank=self.rank,
            world_size=2,
            state=self.state,
            start_wall_ns=WALL0,
            records=self.records,
            groups=self.groups,
            events=[
                {
                    "event": "start",
                    "ppid": self.ppid,
                    "wall_ns": WALL0,
                    "mono_ns": self.mono(0),
                    "thread": "MainThread",
                }
            ],
            meta=self.meta,
        )


def two_ranks(kill_rank1=False):
    """Rank 0 on host a, rank 1 on host b (monotonic clocks 900 s apart). Step 1: phase train
    with all_reduce cp0 #1 (both) and #2 (rank 1 only: in flight = the culprit)."""
    p0 = Proc(0, host="a", offset=WALL0 - 100 * S)
    p1 = Proc(
        1,
        host="b",
        offset=WALL0 - 1000 * S,
        state="killed" if kill_rank1 else "alive",
        meta={"ray_actor_name": "trainer-1"},
    )
    for p in (p0, p1):
        p.add("step", 10 * MS, seq=1, step=1)
        p.add("phase_enter", 11 * MS, phase="train", step=1)
        p.add("memory", 12 * MS, op="phase_enter", group="host", a=(100 << 20, -1, 300 << 20, -1, -1))
        p.add(
            "collective",
            20 * MS + p.rank * MS,
            op="all_reduce",
            group="1",
            seq=1,
            end_rel=25 * MS,
            phase="train",
            step=1,
        )
    p0.add("phase_exit", 30 * MS, phase="train", step=1)
    p1.add("collective", 40 * MS, op="all_reduce", group="1", seq=2, state="issued", phase="train", step=1)
    p1.add("memory", 50 * MS, op="timer", group="host", a=(120 << 20, -1, 320 << 20, -1, -1))
    return p0, p1


DIAG = {
    "kind": "skipped-collective",
    "culprit_ranks": [1],
    "group": "1",
    "seq": 2,
    "op": "all_reduce",
    "summary": "rank 1 issued one more all_reduce",
    "details": {"hang_start_wall_ns": WALL0 + 25 * MS},
}


def trace_of(procs, diag=DIAG, reason="stall", taken=WALL0 + 2 * S, **kw):
    snap = Snapshot(run_dir="/r", taken_wall_ns=taken, reason=reason, processes=[p.build() for p in procs])
    t = build_timeline(snap, diag, **kw)
    return json.loads(orjson.dumps(t))  # what a reader of the file sees


def by(t, **kw):
    return [e for e in t["traceEvents"] if all(e.get(k) == v for k, v in kw.items())]


def names(t):
    return {e["pid"]: e["args"]["name"] for e in by(t, ph="M", name="process_name")}


def test_tracks_named_with_rank_host_pid_actor_and_culprit():
    t = trace_of(two_ranks())
    n = names(t)
    assert sorted(n.values()) == ["CULPRIT rank 1 · b:1001 · trainer-1", "rank 0 · a:1000"]
    labels = by(t, ph="M", name="process_labels")
    assert [n[e["pid"]] for e in labels] == ["CULPRIT rank 1 · b:1001 · trainer-1"]


def test_clocks_aligned_across_hosts():
    t = trace_of(two_ranks())
    n = {v.split(" · ")[0].replace("CULPRIT ", ""): k for k, v in names(t).items()}
    s0 = [e for e in by(t, ph="X", cat="phase", pid=n["rank 0"])][0]
    s1 = [e for e in by(t, ph="X", cat="phase", pid=n["rank 1"])][0]
    assert s0["ts"] == s1["ts"]  # both entered 'train' at the same wall instant, 900 s apart in mono
    c0 = [e for e in by(t, ph="X", cat="collective", pid=n["rank 0"])][0]
    c1 = [e for e in by(t, ph="X", cat="collective", pid=n["rank 1"])][0]
    assert c1["ts"] - c0["ts"] == 1000.0  # rank 1 issued 1 ms later
    assert t["otherData"]["clock_offsets_ns"] == {"a": WALL0 - 100 * S, "b": WALL0 - 1000 * S}


def test_open_collective_marked_and_ends_at_snapshot():
    t = trace_of(two_ranks())
    v = [e for e in by(t, ph="X", cat="collective") if "verdict" in e["args"]]
    assert len(v) == 1 and v[0]["args"]["open"] and v[0]["args"]["seq"] == 2
    assert v[0]["name"] == "VERDICT skipped-collective: all_reduce cp0 #2 (in flight)"
    assert v[0]["ts"] + v[0]["dur"] == by(t, ph="i", name="stall detected")[0]["ts"]
    assert by(t, ph="i", name="stall detected")[0]["s"] == "g"
    assert by(t, ph="i", name="last progress")[0]["ts"] == 25000.0


def test_killed_rank_track_ends_at_last_record():
    t = trace_of(two_ranks(kill_rank1=True), diag=None, reason="death")
    pid1 = [k for k, v in names(t).items() if v.startswith("rank 1")][0]
    evs = [e for e in t["traceEvents"] if e.get("pid") == pid1 and e["ph"] != "M"]
    end = max(e["ts"] + e.get("dur", 0) for e in evs)
    assert end == 50000.0  # its last record (a memory sample at +50 ms), not the snapshot (+2 s)
    death = by(t, ph="i", cat="death", pid=pid1)
    assert death and death[0]["ts"] == 50000.0


def test_flows_link_same_group_seq_across_ranks():
    t = trace_of(two_ranks())
    flows = [e for e in t["traceEvents"] if e.get("cat") == "flow"]
    assert [e["ph"] for e in flows] == ["s", "f"]  # cp0 #1 on both ranks; #2 only on rank 1
    assert flows[0]["id"] == flows[1]["id"] and flows[0]["pid"] != flows[1]["pid"]
    assert [e["args"]["rank"] for e in flows] == [0, 1]  # arrival order: rank 1 came last


def test_phases_steps_and_memory_counters():
    t = trace_of(two_ranks())
    n = {v.split(" · ")[0].replace("CULPRIT ", ""): k for k, v in names(t).items()}
    ph1 = by(t, ph="X", cat="phase", pid=n["rank 1"])[0]
    assert ph1["name"] == "train" and ph1["args"]["open"]  # rank 1 never left train
    ph0 = by(t, ph="X", cat="phase", pid=n["rank 0"])[0]
    assert ph0["dur"] == 19000.0 and "open" not in ph0["args"]
    steps = by(t, ph="X", cat="step")
    assert {e["name"] for e in steps} == {"step 1"}
    c = by(t, ph="C", pid=n["rank 1"])
    assert [e["args"]["rss"] for e in c] == [100 << 20, 120 << 20]
    assert c[0]["name"] == "memory [bytes]" and c[0]["args"]["cgroup"] == 300 << 20


def test_helper_process_grouped_under_its_rank():
    p0, p1 = two_ranks()
    h = Proc(-1, host="a", pid=2000, offset=p0.offset, ppid=p0.pid)
    h.add("memory", 5 * MS, op="timer", group="host", a=(5 << 20, -1, -1, -1, -1))
    t = trace_of([p0, p1, h])
    n = names(t)
    assert len(n) == 2 and any(v.startswith("rank 0 · a:1000 (+1 helper process)") for v in n.values())
    assert by(t, ph="C", name="helper 2000: memory [bytes]")


def test_ranks_and_window_filters():
    t = trace_of(two_ranks(), options=TimelineOptions(ranks=frozenset({0})))
    assert list(names(t).values()) == ["rank 0 · a:1000"]
    t = trace_of(two_ranks(), options=TimelineOptions(since_s=0.015))
    # step 1 began at +10 ms, before the window, and goes on: shown from the window's start
    assert {(e["ts"], e["name"]) for e in by(t, ph="X", cat="step")} == {(0.0, "step 1")}
    assert all(e["ts"] >= 0 for e in t["traceEvents"] if e["ph"] != "M")
    assert not by(t, ph="C", args={"rss": 100 << 20, "cgroup": 300 << 20})  # the +12 ms sample: before
    # negative: counted back from the run's end (+2 s, the snapshot); until: cut there
    t = trace_of(two_ranks(), options=TimelineOptions(since_s=-1.99, until_s=-1.96))
    evs = [e for e in t["traceEvents"] if e["ph"] != "M"]
    assert evs and all(0 <= e["ts"] and e["ts"] + e.get("dur", 0) <= 30_000.0 + 0.01 for e in evs)
    assert [e["args"]["rss"] for e in by(t, ph="C")] == [100 << 20] * 2  # +12 ms in, +50 ms out
    assert t["otherData"]["window_wall_ns"] == [WALL0 + 10 * MS, WALL0 + 40 * MS]


def test_deep_events_merged_into_rank_track():
    p0, p1 = two_ranks()
    # viztracer clock = monotonic µs + 7 s; one function at mono +20 ms on host b
    viz = (p1.mono(20 * MS)) / 1000.0 + 7e6
    d = DeepTrace(
        host="b",
        pid=p1.pid,
        viz_us=viz,
        mono_ns=p1.mono(20 * MS),
        events=(
            {"ph": "M", "name": "thread_name", "pid": 9, "tid": 77, "args": {"name": "MainThread"}},
            {"ph": "X", "name": "train_step (x.py:3)", "ts": viz, "dur": 5.0, "pid": 9, "tid": 77},
        ),
    )
    t = trace_of([p0, p1], deep=[d])
    ev = by(t, ph="X", cat="deep")
    pid1 = [k for k, v in names(t).items() if "rank 1" in v][0]
    assert len(ev) == 1 and ev[0]["pid"] == pid1 and ev[0]["ts"] == 20000.0
    assert by(t, ph="M", name="thread_name", tid=ev[0]["tid"])[0]["args"]["name"] == "deep: MainThread"


def _large(n_ranks, n_records):
    """n_ranks processes sharing one list of n_records records (same timings), each with
    one in-flight collective at the end: memory stays small."""
    shared = []
    for i in range(n_records - 1):
        kind = "memory" if i % 10 == 0 else "collective"
        shared.append(
            rec(
                i + 1,
                kind,
                1 * S + i * MS,
                op="all_reduce" if kind != "memory" else "timer",
                group="0" if kind != "memory" else "host",
                seq=i + 1,
                end=1 * S + i * MS + MS // 2,
                a=(1 << 20, -1, -1, -1, -1),
                wall_offset=WALL0,
            )
        )
    last = rec(
        n_records,
        "collective",
        1 * S + n_records * MS,
        op="all_reduce",
        group="0",
        seq=n_records,
        state="issued",
        wall_offset=WALL0,
    )
    procs = [
        ProcessInfo(
            host="h%d" % (r // 8),
            pid=100 + r,
            rank=r,
            world_size=n_ranks,
            state="alive",
            records=shared + [last],
        )
        for r in range(n_ranks)
    ]
    return Snapshot(run_dir="/r", taken_wall_ns=WALL0 + 10 * S, reason="stall", processes=procs)


def test_large_run_sampled_under_budget():
    snap = _large(1024, 2000)
    budget = 200_000
    t = build_timeline(snap, None, options=TimelineOptions(max_events=budget))
    data = orjson.dumps(t)
    evs = t["traceEvents"]
    meta = sum(1 for e in evs if e["ph"] == "M")
    assert len(evs) - meta <= budget * 1.05, len(evs)
    assert len(names(json.loads(data))) == 1024  # every rank keeps its track
    opened = [e for e in evs if e["ph"] == "X" and e["args"].get("open")]
    assert len(opened) == 1024  # every rank's in-flight collective survives sampling
    s = t["otherData"]["sampling"]
    assert s["records_dropped"] > 0 and s["records_total"] == 1024 * 2000
